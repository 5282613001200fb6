"""Figures versus targets: the end-of-run table and the JSON record.

Pure formatting: takes the result dicts of `scenarios` and returns rows and
text. Missed targets are results, not errors; the gap is stated in the row.
CPU columns are over the measured phase, in % of one core: the server, the load
generator (its worker processes plus the controller), and everything else that
ran on the machine meanwhile ("others": other tenants, unattributed kernel work).
"""

from __future__ import annotations

import statistics
from typing import Any

Row = dict[str, Any]
# A soak's RSS may rise no faster than this over its last half: flat within the
# noise of malloc (issue 26: 2 MB/min before the fix, ~3 GB a day)
SOAK_SLOPE_MB_PER_MIN = 0.25


def _row(name: str, value: float | None, unit: str, target: float | None, better: str,
         server_cpu: str = "", generator_cpu: str = "", note: str = "",
         others: float | None = None) -> Row:
    if value is None:
        verdict = "no figure"
    elif target is None:
        verdict = ""
    elif (value <= target) if better == "lower" else (value >= target):
        verdict = "met"
    else:
        ratio = value / target if better == "lower" else target / value if value else float("inf")
        verdict = f"MISSED ({ratio:.2f}x)"
    return {
        "figure": name,
        "value": value,
        "unit": unit,
        "target": target,
        "target_text": "" if target is None else ("<= " if better == "lower" else ">= ")
        + _fmt(target, unit),
        "verdict": verdict,
        "server_cpu": server_cpu,
        "generator_cpu": generator_cpu,
        "others_cpu": "" if others is None else f"{others:.0f}%",
        "note": note,
    }


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "KB":
        return f"{v:.2f} KB"
    if unit == "ms":
        return f"{v:.0f} ms"
    if unit == "%":
        return f"{v:.2f} %"
    if unit == "s":
        return f"{v:.3f} s"
    if unit == "/s":
        return f"{v:,.0f}/s"
    if unit == "MB/min":
        return f"{v:+.2f} MB/min"
    if unit == "x":
        return f"{v:.2f}x"
    return f"{v}"


def _pct(u: dict[str, float], key: str) -> str:
    return f"{u[key + '_cpu_s']:.2f} s ({u[key + '_cpu_pct']:.0f}% of a core)"


def rows(results: dict[str, Any], targets_apply: bool) -> list[Row]:
    out: list[Row] = []
    t = (lambda x: x) if targets_apply else (lambda x: None)

    mem = results.get("memory")
    if isinstance(mem, dict) and "error" not in mem:
        for n, m in mem.items():
            out.append(_row(
                f"memory per held poll @ {int(n):,}", m["median_bytes_per_poll"] / 1024, "KB",
                t(8.0), "lower",
                f"{m['server_cpu_pct_median']:.0f}% of a core while opening",
                f"{m['generator_cpu_pct_median']:.0f}% of a core while opening",
                f"median of {len(m['samples'])} fresh servers; range "
                f"{m['min_bytes_per_poll'] / 1024:.2f}-{m['max_bytes_per_poll'] / 1024:.2f} KB",
                _median(s["usage_while_opening"]["others_cpu_pct"] for s in m["samples"]),
            ))
    fan = results.get("fanout")
    if isinstance(fan, dict) and "error" not in fan:
        u = fan["usage_all_publishes"]
        n = fan["subscribers"]
        note = f"{fan['publishes']} publishes to {n:,} subscribers"
        out.append(_row(f"fan-out {n:,}: last subscriber p50", 1000 * fan["last_p50_s"], "ms",
                        t(400.0), "lower", _pct(u, "server"), _pct(u, "generator"), note,
                        u["others_cpu_pct"]))
        out.append(_row(f"fan-out {n:,}: last subscriber p99", 1000 * fan["last_p99_s"], "ms",
                        None, "lower", "", "",
                        f"median subscriber p50 {1000 * fan['median_subscriber_p50_s']:.0f} ms"))
        out.append(_row(f"fan-out {n:,}: delivered", fan["delivered_pct"], "%", t(100.0),
                        "higher", "", "", f"worst publish {fan['min_round_delivered_pct']:.2f} %"))
        gen = fan["generator_cpu_s_per_10k_deliveries"]
        out.append(_row("server CPU per 10k deliveries", fan["server_cpu_s_per_10k_deliveries"],
                        "s", t(0.4), "lower", "", f"{gen:.3f} s per 10k" if gen else "",
                        "publish + fan-out + re-polls; publish-to-last-receipt only: "
                        f"{fan['server_cpu_s_per_10k_in_rounds']:.3f} s"))
    dfr = results.get("fanout_deferred")
    if isinstance(dfr, dict) and "error" not in dfr:
        u = dfr["usage_all_publishes"]
        n = dfr["subscribers"]
        out.append(_row(f"diagnostic: fan-out {n:,}, re-poll after round: last p50",
                        1000 * dfr["last_p50_s"], "ms", None, "lower",
                        _pct(u, "server"), _pct(u, "generator"),
                        f"{dfr['publishes']} publishes; p99 {1000 * dfr['last_p99_s']:.0f} ms; "
                        f"delivered {dfr['delivered_pct']:.2f} %", u["others_cpu_pct"]))
        out.append(_row("diagnostic: server CPU per 10k, publish to last receipt",
                        dfr["server_cpu_s_per_10k_in_rounds"], "s", None, "lower", "",
                        f"{dfr['generator_cpu_s_per_10k_in_rounds']:.3f} s per 10k",
                        "no re-polls inside the window: the fan-out alone; whole loop incl. "
                        f"re-polls {dfr['server_cpu_s_per_10k_deliveries']:.3f} s"))
    pub = results.get("publish")
    if isinstance(pub, dict) and "error" not in pub:
        s0 = pub["samples"][0]
        out.append(_row(
            f"publishes/s, {s0['publishers']} keep-alive publishers", pub["median_per_second"],
            "/s", t(8000.0), "higher",
            f"{pub['server_cpu_pct_median']:.0f}% of a core",
            f"{pub['generator_cpu_pct_median']:.0f}% of a core",
            f"median of {len(pub['samples'])} x {s0['duration_s']:.0f} s; range "
            f"{pub['min_per_second']:,.0f}-{pub['max_per_second']:,.0f}/s; per server "
            f"CPU-second {pub['median_per_server_cpu_second']:,.0f}/s (one uncontended core)",
            _median(s["usage"]["others_cpu_pct"] for s in pub["samples"]),
        ))
    big = results.get("16k")
    if isinstance(big, dict) and "error" not in big:
        u = big["usage_all_publishes"]
        n = big["subscribers"]
        out.append(_row(f"{n:,} held, one publish: delivered", big["min_round_delivered_pct"],
                        "%", t(100.0), "higher", _pct(u, "server"), _pct(u, "generator"),
                        f"held {big['opened']:,}; last subscriber p50 "
                        f"{1000 * big['last_p50_s']:.0f} ms; "
                        f"{big['bytes_per_poll'] / 1024:.2f} KB/poll", u["others_cpu_pct"]))
    clu = results.get("cluster")
    if isinstance(clu, dict) and "error" not in clu:
        for k, c in clu.items():
            out.append(_row(
                f"cluster fan-out {c['subscribers']:,} over {k} node(s): last p50",
                1000 * c["last_p50_s"], "ms", None, "lower",
                f"{c['server_cpu_s']:.1f} s ({c['server_cpu_pct']:.0f}% of a core, all nodes)",
                "", f"{c['publishes']} publishes on node 1; p99 {1000 * c['last_p99_s']:.0f} ms; "
                f"delivered {c['delivered_pct']:.2f} %"))
    prop = results.get("propagation")
    if isinstance(prop, dict) and "error" not in prop:
        out.append(_row(
            f"3-node cluster: publishes/s on node 1, {prop['publishers']} publishers",
            prop["per_second"], "/s", None, "higher",
            f"{prop['cluster_cpu_s']:.1f} s all nodes", "",
            f"each sent on to 2 peers; peers confirmed all {prop['peers_confirmed_all_after_s']}"
            f" s after the run; messages per node {prop['messages_per_node']}"))
        out.append(_row("peer lag node 1 -> node 3, idle: p50", prop["lag_idle_p50_ms"], "ms",
                        None, "lower", "", "", f"p99 {prop['lag_idle_p99_ms']:.1f} ms"))
        out.append(_row("peer lag node 1 -> node 3, under that load: p50",
                        prop["lag_loaded_p50_ms"], "ms", None, "lower", "", "",
                        f"p99 {prop['lag_loaded_p99_ms']:.1f} ms; samples "
                        f"{prop['lag_samples'][1]}"))
    ack = results.get("ack")
    if isinstance(ack, dict) and "error" not in ack:
        for mode, a in ack.items():
            what = ("201 once a peer holds it" if mode == "peer" else "201 at once")
            out.append(_row(f"3-node mesh, --publish-ack {mode}: lone publish p50",
                            a["lone_p50_ms"], "ms", None, "lower", "", "",
                            f"{what}; p99 {a['lone_p99_ms']:.2f} ms over "
                            f"{a['lone_publishes']} publishes, one after another"))
            out.append(_row(f"3-node mesh, --publish-ack {mode}: publishes/s, "
                            f"{a['publishers']} publishers", a["per_second"], "/s", None,
                            "higher", f"{a['cluster_cpu_s']:.1f} s all nodes", "",
                            f"latency p50 {a['loaded_p50_ms']:.2f} ms, p99 "
                            f"{a['loaded_p99_ms']:.2f} ms; 202s {a['unconfirmed_202']}"))
    soak = results.get("soak")
    if isinstance(soak, dict) and "error" not in soak:
        what = (f"{soak['subscribers']:,} polls on {soak['channels']} channels, a publish per "
                f"channel a second, {soak['minutes']:g} min")
        out.append(_row("soak: RSS slope over the last half", soak["slope_last_half_mb_per_min"],
                        "MB/min", t(SOAK_SLOPE_MB_PER_MIN), "lower",
                        f"{soak['server_cpu_pct']:.0f}% of a core",
                        f"{soak['generator_cpu_pct']:.0f}% of a core",
                        f"{what}; RSS {soak['rss_start_mb']:.1f} -> {soak['rss_end_mb']:.1f} MB"))
        d = soak["deliveries"]
        out.append(_row("soak: delivered once", soak["delivered_pct"], "%", t(100.0), "higher",
                        "", "", f"{d['received']:,} of {d['expected']:,}; duplicates "
                        f"{d['duplicate']}, missed {d['missed']}"))
    out += interest_rows(results.get("interest"), targets_apply)
    out += capacity_rows(results.get("capacity"), targets_apply)
    for name, res in results.items():
        if isinstance(res, dict) and "error" in res:
            out.append(_row(f"{name}: ERROR", None, "", None, "lower", note=res["error"][:200]))
    return out


def interest_rows(res: Any, targets_apply: bool) -> list[Row]:
    """Issue 37: B's CPU / A's per width (interest.py), against its target."""
    if not isinstance(res, dict) or "error" in res:
        return []
    out = []
    for w, r in res["widths"].items():
        if "error" in r:
            out.append(_row(f"interest W={int(w):,}: ERROR", None, "", None, "lower",
                            note=r["error"][:200]))
            continue
        followed = r["b_followed"] if r["b_channels_followed"] is None else (
            f"{r['b_followed']} partitions, {r['b_channels_followed']:,} channels")
        out.append(_row(
            f"interest: B's CPU / A's, B holding {int(w):,} channels", r["b_over_a"], "x",
            res["target"] if targets_apply else None, "lower",
            f"A {r['a_cpu_s']:.2f} s, B {r['b_cpu_s']:.2f} s",
            f"{r['generator_cpu_s']:.2f} s ({r['generator_cpu_pct']:.0f}% of a core)",
            f"{r['per_second']:,.0f} publishes/s on A; B follows {followed}; B RSS "
            f"{r['b_rss_mb']['held']} MB ({r['b_rss_kb_per_channel']} KB per channel held); "
            f"redis {r['redis_cpu_s']:.2f} s"))
    return out


def capacity_rows(res: Any, targets_apply: bool) -> list[Row]:
    """Issues 28 and 37: k nodes' capacity / 1 node's, per workload and mode, where a
    target applies (capacity.py's table has every figure)."""
    if not isinstance(res, dict) or "error" in res:
        return []
    out = []
    for name, wl in res["workloads"].items():
        for mode, rows in wl["modes"].items():
            one = rows.get("1", {})
            for k, r in rows.items():
                if k == "1" or r.get("target_ratio") is None:
                    continue
                best = r.get("at_capacity") or {}
                cpu = best.get("cpu_pct", {})
                out.append(_row(
                    f"capacity {name} {mode}: {k} nodes / 1", r.get("ratio_to_1"), "x",
                    r["target_ratio"] if targets_apply else None, "higher",
                    "nodes " + " / ".join(f"{cpu[g]:.0f}%" for g in sorted(cpu)
                                          if g.startswith("node")) if cpu else "",
                    f"{cpu['generator']:.0f}% of a core" if "generator" in cpu else "",
                    f"{r.get('capacity')} against {one.get('capacity')} publishes/s"
                    + (f"; {r['error']}" if "error" in r else "")))
    return out


def _median(values: Any) -> float:
    return statistics.median(list(values))


def table(rs: list[Row]) -> str:
    head = ["figure", "value", "target", "verdict", "server CPU", "generator CPU", "others"]
    body = [[r["figure"], _fmt(r["value"], r["unit"]), r["target_text"], r["verdict"],
             r["server_cpu"], r["generator_cpu"], r["others_cpu"]] for r in rs]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=False)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=False)),
             "  ".join("-" * w for w in widths)]
    for r, b in zip(rs, body, strict=False):
        lines.append("  ".join(c.ljust(w) for c, w in zip(b, widths, strict=False)).rstrip())
        if r["note"]:
            lines.append("    " + r["note"])
    return "\n".join(lines)


# -- side by side with nginx + nchan (compare.py) ------------------------------------------

COMPARE_COLUMNS = ["pushup-1", "pushup-2", "nchan"]
# (ratio name, numerator, denominator) printed after the figures
COMPARE_RATIOS = [("PushUp / nchan", "pushup-1", "nchan"),
                  ("--workers 2 / nchan", "pushup-2", "nchan")]


def _get(res: dict[str, Any], scenario: str, key: str, field: str,
         scale: float = 1.0) -> float | None:
    r = res.get(scenario, {}).get(key)
    if not isinstance(r, dict) or "error" in r or r.get(field) is None:
        return None
    return float(r[field]) * scale


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def compare_rows(res: dict[str, Any]) -> list[Row]:
    """One row per figure: the value for each server and the ratios to nchan."""
    specs = [  # (figure, scenario, field, scale, unit)
        ("fan-out: last subscriber p50", "fanout", "last_p50_s", 1000, "ms"),
        ("fan-out: last subscriber p99", "fanout", "last_p99_s", 1000, "ms"),
        ("fan-out: all deliveries p50", "fanout", "all_p50_s", 1000, "ms"),
        ("fan-out: all deliveries p99", "fanout", "all_p99_s", 1000, "ms"),
        ("fan-out: delivered", "fanout", "delivered_pct", 1, "%"),
        ("server CPU per 10k deliveries (incl. re-polls)", "fanout",
         "server_cpu_s_per_10k_deliveries", 1, "s"),
        ("publishes/s", "publish", "median_per_second", 1, "/s"),
        ("publishes per server CPU-second", "publish", "median_per_server_cpu_second", 1, "/s"),
        ("RSS per held poll", "memory", "median_bytes_per_poll", 1 / 1024, "KB"),
    ]
    rows = []
    for figure, scenario, field, scale, unit in specs:
        values = {k: _get(res, scenario, k, field, scale) for k in COMPARE_COLUMNS}
        rows.append({"figure": figure, "unit": unit, "values": values,
                     "ratios": {name: _ratio(values[a], values[b])
                                for name, a, b in COMPARE_RATIOS}})
    # Who used the CPU meanwhile: a generator near the machine's spare capacity means
    # the client, not the server, set that figure; "others" is the shared machine's noise.
    for scenario in ("fanout", "publish"):
        for key in COMPARE_COLUMNS:
            r = res.get(scenario, {}).get(key)
            if not isinstance(r, dict) or "error" in r:
                continue
            u = r["usage_all_publishes"] if scenario == "fanout" else r["samples"][0]["usage"]
            rows.append({"figure": f"  {scenario} CPU, {res['labels'][key]}", "unit": "note",
                         "values": {}, "ratios": {},
                         "note": f"server {u['server_cpu_pct']:.0f}%, generator "
                         f"{u['generator_cpu_pct']:.0f}%, others {u['others_cpu_pct']:.0f}% "
                         "of a core"})
    return rows


def compare_targets(res: dict[str, Any]) -> list[Row]:
    """Issue 7's targets, as ratios from this one run."""
    cpu = {k: _get(res, "fanout", k, "server_cpu_s_per_10k_deliveries") for k in COMPARE_COLUMNS}
    pub = {k: _get(res, "publish", k, "median_per_second") for k in COMPARE_COLUMNS}
    p50 = {k: _get(res, "fanout", k, "last_p50_s") for k in COMPARE_COLUMNS}
    delivered = _get(res, "fanout", "pushup-2", "delivered_pct")
    rss = _get(res, "memory", "pushup-1", "median_bytes_per_poll", 1 / 1024)
    specs = [  # (target, value, limit, better, unit)
        ("server CPU per 10k deliveries, PushUp / nchan", _ratio(cpu["pushup-1"], cpu["nchan"]),
         2.0, "lower", "x"),
        ("publishes/s, one PushUp process / nchan", _ratio(pub["pushup-1"], pub["nchan"]),
         0.3, "higher", "x"),
        ("fan-out last subscriber p50, --workers 2 / nchan",
         _ratio(p50["pushup-2"], p50["nchan"]), 1.0, "lower", "x"),
        ("fan-out delivered, --workers 2", delivered, 100.0, "higher", "%"),
        ("publishes/s, --workers 2 / --workers 1", _ratio(pub["pushup-2"], pub["pushup-1"]),
         1.0, "above", "x"),
        ("RSS per held poll, PushUp", rss, 6.0, "lower", "KB"),
    ]
    return [_verdict(*s) for s in specs]


def _verdict(name: str, value: float | None, limit: float, better: str, unit: str) -> Row:
    def shown(v: float) -> str:
        return f"{v:.2f}x" if unit == "x" else _fmt(v, unit)

    op = {"lower": "<=", "higher": ">=", "above": ">"}[better]
    if value is None:
        verdict = "no figure"
    elif (value <= limit if better == "lower" else value >= limit if better == "higher"
          else value > limit):
        verdict = "met"
    else:
        factor = value / limit if better == "lower" else limit / value if value else float("inf")
        verdict = f"MISSED by {factor:.2f}x"
    return {"target": name, "value": value, "text": "-" if value is None else shown(value),
            "limit": f"{op} {shown(limit)}", "verdict": verdict}


def compare_table(res: dict[str, Any], quick: bool = False) -> str:
    labels = res["labels"]
    head = ["figure"] + [labels[k] for k in COMPARE_COLUMNS] + [n for n, _, _ in COMPARE_RATIOS]
    body = []
    for r in compare_rows(res):
        if r["unit"] == "note":
            body.append([r["figure"] + ": " + r["note"]])
            continue
        body.append([r["figure"]] + [_fmt(r["values"][k], r["unit"]) for k in COMPARE_COLUMNS]
                    + ["-" if r["ratios"][n] is None else f"{r['ratios'][n]:.2f}x"
                       for n, _, _ in COMPARE_RATIOS])
    lines = [f"Side by side: {res['subscribers']:,} subscribers, {res['publishes']} publishes; "
             f"{res['publishers']} publishers; RSS at {res['subscribers']:,} held polls", ""]
    lines += grid(head, body)
    lines += ["", "Targets (ratios from this run" + (
        "; --quick: tiny scale, indicative only):" if quick else "):")]
    t_rows = [[t["target"], t["text"], t["limit"], t["verdict"]] for t in compare_targets(res)]
    lines += grid(["target", "this run", "target", "verdict"], t_rows)
    return "\n".join(lines)


def grid(head: list[str], body: list[list[str]]) -> list[str]:
    """Left-aligned columns; a one-cell row is a note spanning the line."""
    full = [b for b in body if len(b) == len(head)]
    widths = [max(len(x) for x in col) for col in zip(head, *full, strict=True)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip(),
           "  ".join("-" * w for w in widths)]
    for b in body:
        out.append(b[0] if len(b) == 1 else
                   "  ".join(c.ljust(w) for c, w in zip(b, widths, strict=True)).rstrip())
    return out
