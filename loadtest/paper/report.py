"""Tables and figures from a results.jsonl written by loadtest.paper.run.

    python -m loadtest.paper.report [DIR]    # writes DIR/report.md and DIR/fig*.png
                                       # (default loadtest/out/quick, the scratch run)

Tables are shaped like the paper's Table 1 (NT) and Table 2 (MPT), each cell
"ours (paper)"; figures follow Figures 7-13, each with a lower panel showing
the CPU of the load generator (busiest Locust process) and of the server, so
a point where Locust itself was saturated is visible next to the number.
Paper values on figures are read off the paper's charts (approximate) and
drawn as open markers.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

# The paper's Table 1 (KB) and Table 2 (s), cc -> mode -> {interval: value}.
INTERVALS = [10, 20, 30, 40, 50]
PAPER_NT = {
    10: {"cp": [12.7, 25.8, 39.8, 55.2, 68.2], "mlp": [1.27] * 5, "elp": [1.27] * 5},
    100: {"cp": [127.4, 277.1, 415.2, 580.5, 745.5], "mlp": [12.7, 12.7, 12.7, 12.7, 13.1],
          "elp": [12.7] * 5},
    1000: {"cp": [1370.5, 3457.1, 5537.5, 7282.5, 10743.5],
           "mlp": [135.5, 132.5, 137.8, 133.4, 135.5],
           "elp": [130.1, 129.5, 132.8, 131.8, 130.5]},
}
PAPER_MPT = {
    10: {"cp": [0.6, 0.7, 0.5, 0.7, 0.8], "mlp": [0.1, 0.0, 0.1, 0.2, 0.1],
         "elp": [0.2, 0.1, 0.1, 0.4, 0.2]},
    100: {"cp": [0.8, 1.1, 2.5, 3.1, 2.7], "mlp": [0.5, 0.4, 0.5, 0.8, 1.1],
          "elp": [0.7, 0.4, 0.8, 1.2, 0.9]},
    1000: {"cp": [2.8, 3.4, 4.5, 5.3, 7.2], "mlp": [2.3, 2.9, 2.7, 3.5, 3.4],
           "elp": [2.4, 2.8, 1.8, 2.4, 2.9]},
}
# Figures 9-13, only the points peers.md reads off the charts (approximate).
PAPER_SMU_PCT = {"elp": {500: 5, 16000: 60}, "mlp": {8000: 100}}  # % of 8 GB
PAPER_MPT_SCALE = {"elp": {16000: 21.5}, "mlp": {16000: 28.0}}
PAPER_RMP_SCALE = {"elp": {500: 100, 1000: 100, 2000: 100, 16000: 52}, "mlp": {16000: 7}}
PAPER_RMP_NODES = {1: {2000: 100, 16000: 52}, 2: {4000: 100, 16000: 80},
                   3: {6000: 100, 16000: 90}, 4: {8000: 100, 16000: 95}}
MODES = ["cp", "mlp", "elp"]
NAMES = {"cp": "CP", "mlp": "MLP", "elp": "ELP"}
COLORS = {"cp": "tab:red", "mlp": "tab:orange", "elp": "tab:blue"}



def _save(fig: Any, out: Path, fname: str) -> str:
    """Lay out, write and close a figure; returns its file name."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out / fname, dpi=110)
    plt.close(fig)
    return fname

def load(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, errors = [], []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            (errors if "error" in row else rows).append(row)
    return rows, errors


def _paper(table: dict[int, dict[str, list[float]]], cc: int, mode: str, i: float) -> Any:
    if cc in table and int(i) in INTERVALS and i == int(i):
        return table[cc][mode][INTERVALS.index(int(i))]
    return None


def _cell(value: float | None, paper: float | None, digits: int) -> str:
    ours = "—" if value is None else f"{value:,.{digits}f}"
    return ours if paper is None else f"{ours} ({paper:g})"


def grid_tables(rows: list[dict[str, Any]]) -> str:
    grid = [r for r in rows if r["experiment"] == "grid" and r.get("tag") != "warmup"]
    if not grid:
        return ""
    by: dict[tuple[int, str, float], list[dict[str, Any]]] = defaultdict(list)
    for r in grid:
        by[(r["users"], r["mode"], r["interval_s"])].append(r)
    ccs = sorted({k[0] for k in by})
    ivs = sorted({k[2] for k in by})
    out = []

    def table(title: str, metric: Any, paper: Any, digits: int) -> None:
        out.append(f"### {title}\n")
        for cc in ccs:
            out.append(f"| cc={cc:,} | " + " | ".join(f"{i:g} s" for i in ivs) + " |")
            out.append("|---" * (len(ivs) + 1) + "|")
            for mode in MODES:
                cells = []
                for i in ivs:
                    vals = [metric(r) for r in by.get((cc, mode, i), [])]
                    vals = [v for v in vals if v is not None]
                    v = mean(vals) if vals else None
                    cells.append(_cell(v, paper(cc, mode, i) if paper else None, digits))
                if any(c != "—" for c in cells):
                    out.append(f"| {NAMES[mode]} | " + " | ".join(cells) + " |")
            out.append("")

    def nt_kb(r: dict[str, Any]) -> float | None:
        return r["nt"]["bytes"] / 1000 if r.get("nt") else None

    table("Table 1 — Network traffic per publish interval, KB (paper in brackets)", nt_kb,
          lambda cc, m, i: _paper(PAPER_NT, cc, m, i), 1)
    out.append("KB = 1,000 bytes on the wire (IP+TCP headers, handshakes and ACKs included) "
               "to and from the server port, in a window as long as the interval holding "
               "one publish and its whole fan-out.\n")
    table("Table 2 — Mean publish trip time, s (paper in brackets)",
          lambda r: r.get("mpt_mean_s"), lambda cc, m, i: _paper(PAPER_MPT, cc, m, i), 3)
    out.append("### Table 2b — every grid point: trip-time percentiles, RMP, CPU\n")
    out.append("| cc | mode | interval | MPT mean / p50 / p90 / p99 (s) | received / expected "
               "| RMP | dup | NT bytes (packets) | server CPU % | Locust CPU % (busiest proc "
               "peak) | host CPU % |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for (cc, mode, i), rs in sorted(by.items(), key=lambda kv: (kv[0][0], MODES.index(
            kv[0][1]), kv[0][2])):
        for r in rs:
            nt = r.get("nt") or {}
            out.append(
                f"| {cc:,} | {NAMES[mode]} | {i:g} s | {_f(r.get('mpt_mean_s'))} / "
                f"{_f(r.get('mpt_p50_s'))} / {_f(r.get('mpt_p90_s'))} / "
                f"{_f(r.get('mpt_p99_s'))} | {r['received']:,} / {r['expected']:,} | "
                f"{_f(r.get('rmp_pct'), 1)} % | {r['duplicates']} | "
                f"{nt.get('bytes', '—'):,} ({nt.get('packets', '—'):,}) | "
                f"{_f(r.get('server_cpu_pct'), 0)} | {_f(r.get('gen_cpu_pct'), 0)} "
                f"({_f(r.get('gen_cpu_peak_pct'), 0)}){' ⚠' if _saturated(r) else ''} | "
                f"{_f(r.get('host_cpu_pct'), 0)} |")
    out.append("")
    return "\n".join(out)


def _f(v: Any, digits: int = 3) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def _saturated(r: dict[str, Any]) -> bool:
    return bool(r.get("gen_cpu_warning")) or (r.get("gen_cpu_peak_pct") or 0) >= 90


def scale_rows(rows: list[dict[str, Any]]) -> dict[tuple[str, int], dict[int, dict[str, Any]]]:
    """(mode, nodes) -> users -> one row aggregating the point's messages (the
    mesh's; Redis rows are in ``budget_table``)."""
    out: dict[tuple[str, int], dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        if r["experiment"] != "scale" or r.get("engine", "mesh") != "mesh":
            continue
        out[(r["mode"], r["nodes"])][r["users"]] = r
    return out


def scale_table(rows: list[dict[str, Any]]) -> str:
    sc = scale_rows(rows)
    if not sc:
        return ""
    lines = ["### Event vs thread (Figures 9-11) and nodes (Figures 12-13)\n",
             "| server | nodes | connections | connected | SMU hold / peak (MB) | MPT mean / p50 "
             "/ p99 / max (s) | published / scheduled | received / expected | RMP | dup | gaps "
             "| server CPU % (peak) | HAProxy CPU % | Locust CPU % (busiest proc peak) | "
             "host CPU % |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (mode, nodes), pts in sorted(sc.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for users, r in sorted(pts.items()):
            lines.append(
                f"| {NAMES[mode]} | {nodes} | {users:,} | {r['connected']:,} | "
                f"{_f(r.get('smu_hold_mb'), 0)} / {_f(r.get('smu_peak_mb'), 0)} | "
                f"{_f(r.get('mpt_mean_s'), 2)} / {_f(r.get('mpt_p50_s'), 2)} / "
                f"{_f(r.get('mpt_p99_s'), 2)} / {_f(r.get('mpt_max_s'), 2)} | "
                f"{r['published']} / {r.get('scheduled', '?')} | "
                f"{r['received']:,} / {r['expected']:,} | "
                f"{_f(r.get('rmp_pct'), 1)} % | {r['duplicates']} | {r.get('gaps_seen', 0)} | "
                f"{_f(r.get('server_cpu_pct'), 0)} ({_f(r.get('server_cpu_peak_pct'), 0)}) | "
                f"{_f(r.get('haproxy_cpu_pct'), 0)} | {_f(r.get('gen_cpu_pct'), 0)} "
                f"({_f(r.get('gen_cpu_peak_pct'), 0)}){' ⚠' if _saturated(r) else ''} | "
                f"{_f(r.get('host_cpu_pct'), 0)} |")
    lines.append("\nSMU hold = RSS of the server process(es) just before the first publish, "
                 "with every subscriber connected and waiting; peak = highest 1 s sample. "
                 "⚠ = the busiest Locust process reached ≥ 90 % of a core (or Locust warned). "
                 "RMP = received / (scheduled messages × connected subscribers): a message "
                 "the server did not accept in time counts as lost.\n")
    return "\n".join(lines)


def budget_table(rows: list[dict[str, Any]]) -> str:
    """Scale points run with a CPU budget per node, by engine and node count."""
    pts = [r for r in rows if r["experiment"] == "scale" and
           ("budget_cores" in r and r.get("budget_note") is None and r.get("budget_cores")
            or r.get("engine", "mesh") != "mesh")]
    if not pts:
        return ""
    lines = ["### Nodes with a CPU budget each (Figures 12-13, Locust)\n",
             "| engine | nodes | budget, cores per node | connections | MPT mean / p50 / p99 (s) "
             "| 1 node ÷ this (mean) | RMP | node CPU % (throttled periods) | HAProxy CPU % "
             "| Locust CPU % (busiest proc peak) | host CPU % |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    one = {(r.get("engine", "mesh"), r["users"]): r.get("mpt_mean_s") for r in pts
           if r["nodes"] == 1}
    for r in sorted(pts, key=lambda r: (r.get("engine", "mesh"), r["users"], r["nodes"])):
        engine = r.get("engine", "mesh")
        base = one.get((engine, r["users"]))
        thr = r.get("budget_throttling") or {}
        throttled = sum(v.get("nr_throttled", 0) for v in thr.values())
        periods = sum(v.get("nr_periods", 0) for v in thr.values())
        lines.append(
            f"| {engine} | {r['nodes']} | {_f(r.get('budget_cores'), 2)} | {r['users']:,} | "
            f"{_f(r.get('mpt_mean_s'), 2)} / {_f(r.get('mpt_p50_s'), 2)} / "
            f"{_f(r.get('mpt_p99_s'), 2)} | "
            f"{_f(base / r['mpt_mean_s'], 2) if base and r.get('mpt_mean_s') else '—'} | "
            f"{_f(r.get('rmp_pct'), 1)} % | {_f(r.get('server_cpu_pct'), 0)} "
            f"({throttled:,} of {periods:,}) | {_f(r.get('haproxy_cpu_pct'), 0)} | "
            f"{_f(r.get('gen_cpu_pct'), 0)} ({_f(r.get('gen_cpu_peak_pct'), 0)})"
            f"{' ⚠' if _saturated(r) else ''} | {_f(r.get('host_cpu_pct'), 0)} |")
    lines.append("\nnode CPU = all nodes together, % of one core, mean over the point; "
                 "throttled = CFS periods in which a node's quota ran out, summed over the "
                 "nodes' groups.\n")
    return "\n".join(lines)


# -- figures -----------------------------------------------------------------


def _figure(title: str) -> tuple[Any, Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, cpu) = plt.subplots(2, 1, figsize=(7, 6.2), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1.3]})
    ax.set_title(title)
    ax.grid(alpha=0.3)
    cpu.grid(alpha=0.3)
    cpu.set_ylabel("CPU % of a core")
    cpu.axhline(90, color="grey", lw=0.8, ls=":")
    return plt, fig, (ax, cpu)


def _legend(ax: Any, **kw: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def _cpu(cpu: Any, xs: list[float], rs: list[dict[str, Any]], mode: str, label: str) -> None:
    gen = [r.get("gen_cpu_peak_pct") or 0 for r in rs]
    srv = [r.get("server_cpu_peak_pct") or 0 for r in rs]
    cpu.plot(xs, gen, ls="--", marker=".", color=COLORS[mode], label=f"Locust {label}")
    cpu.plot(xs, srv, ls="-", marker="x", color=COLORS[mode], alpha=0.5,
             label=f"server {label}")


def grid_figures(rows: list[dict[str, Any]], out: Path) -> list[str]:
    grid = [r for r in rows if r["experiment"] == "grid" and r.get("tag") != "warmup"]
    if not grid:
        return []
    cc = max(r["users"] for r in grid)
    made = []
    for fname, title, metric, paper, ylabel, log in [
        ("fig7_nt.png", f"Figure 7: network traffic, cc={cc:,}",
         lambda r: r["nt"]["bytes"] / 1000 if r.get("nt") else None, PAPER_NT,
         "KB per publish interval", True),
        ("fig8_mpt.png", f"Figure 8: mean publish trip time, cc={cc:,}",
         lambda r: r.get("mpt_mean_s"), PAPER_MPT, "MPT (s)", False),
    ]:
        plt, fig, (ax, cpu) = _figure(title)
        for mode in MODES:
            rs = sorted((r for r in grid if r["users"] == cc and r["mode"] == mode),
                        key=lambda r: r["interval_s"])
            pts = [(r["interval_s"], metric(r), r) for r in rs if metric(r) is not None]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=COLORS[mode],
                    label=f"{NAMES[mode]} (PushUp, this machine)")
            if cc in paper:
                ax.plot(INTERVALS, paper[cc][mode], marker="s", mfc="none", ls=":",
                        color=COLORS[mode], label=f"{NAMES[mode]} (paper)")
            _cpu(cpu, [p[0] for p in pts], [p[2] for p in pts], mode, NAMES[mode])
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        _legend(ax, fontsize=7)
        cpu.set_xlabel("publish interval (s)")
        _legend(cpu, fontsize=6, ncol=3)
        made.append(_save(fig, out, fname))
    return made


def scale_figures(rows: list[dict[str, Any]], out: Path) -> list[str]:
    sc = scale_rows(rows)
    if not sc:
        return []
    made = []
    specs = [
        ("fig9_smu.png", "Figure 9: server memory (RSS, all connections held)",
         lambda r: r.get("smu_hold_mb"), "MB", {m: {k: v / 100 * 8192 for k, v in d.items()}
                                                 for m, d in PAPER_SMU_PCT.items()}),
        ("fig10_mpt.png", "Figure 10: mean publish trip time, MLP vs ELP",
         lambda r: r.get("mpt_mean_s"), "MPT (s)", PAPER_MPT_SCALE),
        ("fig11_rmp.png", "Figure 11: received messages, MLP vs ELP", lambda r: r.get("rmp_pct"),
         "RMP (%)", PAPER_RMP_SCALE),
    ]
    for fname, title, metric, ylabel, paper in specs:
        plt, fig, (ax, cpu) = _figure(title + ", 1 node")
        for mode in ("mlp", "elp"):
            pts = sorted(sc.get((mode, 1), {}).items())
            pts = [(u, metric(r), r) for u, r in pts if metric(r) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        color=COLORS[mode], label=f"{NAMES[mode]} (this machine)")
                _cpu(cpu, [p[0] for p in pts], [p[2] for p in pts], mode, NAMES[mode])
            if paper.get(mode):
                xs = sorted(paper[mode])
                ax.plot(xs, [paper[mode][x] for x in xs], marker="s", mfc="none", ls="none",
                        color=COLORS[mode], label=f"{NAMES[mode]} (paper, read off chart)")
        ax.set_xscale("log")
        ax.set_ylabel(ylabel + (" (paper: % of 8 GB → MB)" if fname.startswith("fig9") else ""))
        _legend(ax, fontsize=7)
        cpu.set_xlabel("concurrent connections")
        _legend(cpu, fontsize=6, ncol=2)
        made.append(_save(fig, out, fname))
    node_counts = sorted({n for (m, n) in sc if m == "elp"})
    if len(node_counts) > 1:
        cmap = {1: "tab:blue", 2: "tab:green", 3: "tab:purple", 4: "tab:brown"}
        for fname, title, metric, ylabel, paper in [
            ("fig12_mpt_nodes.png", "Figure 12: MPT with N nodes behind HAProxy",
             lambda r: r.get("mpt_mean_s"), "MPT (s)", {}),
            ("fig13_rmp_nodes.png", "Figure 13: RMP with N nodes behind HAProxy",
             lambda r: r.get("rmp_pct"), "RMP (%)", PAPER_RMP_NODES),
        ]:
            plt, fig, (ax, cpu) = _figure(title)
            for n in node_counts:
                pts = sorted(sc.get(("elp", n), {}).items())
                pts = [(u, metric(r), r) for u, r in pts if metric(r) is not None]
                color = cmap.get(n, "black")
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=color,
                            label=f"{n} node{'s' if n > 1 else ''} (this machine)")
                    cpu.plot([p[0] for p in pts], [p[2].get("gen_cpu_peak_pct") or 0
                                                   for p in pts], ls="--", color=color,
                             label=f"Locust, {n}")
                if paper.get(n):
                    xs = sorted(paper[n])
                    ax.plot(xs, [paper[n][x] for x in xs], marker="s", mfc="none", ls="none",
                            color=color, label=f"{n} (paper, read off chart)")
            ax.set_xscale("log")
            ax.set_ylabel(ylabel)
            _legend(ax, fontsize=7)
            cpu.set_xlabel("concurrent connections")
            _legend(cpu, fontsize=6, ncol=2)
            made.append(_save(fig, out, fname))
    return made


def write_report(out: Path) -> Path:
    rows, errors = load(out / "results.jsonl")
    figs = grid_figures(rows, out) + scale_figures(rows, out)
    runs = sorted({r["run"] for r in rows})
    parts = ["# PushUp load-test report\n",
             f"Runs: {', '.join(runs) or '—'}. Generated by `python -m loadtest.paper.report` from "
             "`results.jsonl` (one JSON line per point; every field is measured). CP = client "
             "pull (PushUp polled every 1 s with timeout=0), MLP = thread-per-request long "
             "polling (`loadtest/paper/mlp.py`, same core), ELP = `pushup serve`.\n"]
    if errors:
        parts.append("**Points that failed:**\n")
        parts += [f"- {e['experiment']} {e['mode']} {e['users']}: {e['error']}" for e in errors]
        parts.append("")
    parts.append(grid_tables(rows))
    parts.append(scale_table(rows))
    parts.append(budget_table(rows))
    if figs:
        parts.append("### Figures\n")
        parts += [f"![{f}]({f})" for f in figs]
    path = out / "report.md"
    path.write_text("\n".join(parts) + "\n")
    return path


if __name__ == "__main__":
    print(write_report(Path(sys.argv[1] if len(sys.argv) > 1 else "loadtest/out/quick")))
