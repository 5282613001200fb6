"""The figures, drawn from the JSON rows alone (so they can be redrawn from results.jsonl).

Each figure shows the load generator's and the rest of the machine's CPU in a
panel beside the measured figure: a saturated generator or a busy neighbour
is then visible next to the number it may have distorted.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

COLORS = {"select": "tab:red", "poll": "tab:orange", "epoll": "tab:blue"}
SIZE_COLORS = {100: "tab:green", 2048: "tab:purple", 10240: "tab:brown"}

Row = dict[str, Any]


def matching(rows: list[Row], **match: Any) -> list[Row]:
    """The rows matching `match`; repetitions of one point are merged into their median
    (with `reply_rate_min` / `reply_rate_max`)."""
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    if not found or found[0].get("experiment") != "reactors":
        return found
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for r in found:
        groups.setdefault((r["reactor"], r["idle"], r["kind"], r["offered_rate"]), []).append(r)
    return [median_row(g) for g in groups.values()]


def median_row(group: list[Row]) -> Row:
    out = dict(group[0])
    for key, value in group[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            values = [r[key] for r in group if isinstance(r.get(key), (int, float))]
            out[key] = statistics.median(values)
    out["reply_rate_min"] = min(r["reply_rate"] for r in group)
    out["reply_rate_max"] = max(r["reply_rate"] for r in group)
    out["reps"] = len(group)
    return out


def _cpu_panel(ax: Any, xs: list[Any], rows: list[Row], label: str, color: str,
               style: str = "-") -> None:
    ax.plot(xs, [r["generator_cpu_pct"] for r in rows], style, color=color, marker=".",
            label=f"{label} generator")
    ax.plot(xs, [r["others_cpu_pct"] for r in rows], ":", color=color, alpha=0.6,
            label=f"{label} others")


def reactors_offered(rows: list[Row], out: Path) -> Path:
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.8))
    for reactor, color in COLORS.items():
        ns = sorted({r["idle"] for r in matching(rows, experiment="reactors", reactor=reactor)})
        if not ns:
            continue
        for n, style in ((ns[0], "-"), (ns[-1], "--")):
            pts = sorted(matching(rows, experiment="reactors", reactor=reactor, idle=n,
                             kind="subscribe"), key=lambda r: r["offered_rate"])
            if len(pts) < 2:
                continue
            xs = [r["offered_rate"] for r in pts]
            label = f"{reactor} N={n}"
            a.plot(xs, [r["reply_rate"] for r in pts], style, color=color, marker="o",
                   label=label)
            b.plot(xs, [r["server_cpu_us_per_reply"] or 0 for r in pts], style, color=color,
                   marker="o", label=label)
            _cpu_panel(c, xs, pts, label, color, style)
    lim = max([r["offered_rate"] for r in matching(rows, experiment="reactors")] or [1])
    a.plot([0, lim], [0, lim], color="grey", lw=0.5)
    a.set(title="Pull subscribes (timeout=0): reply rate vs offered rate",
          xlabel="offered rate (req/s)", ylabel="reply rate (replies/s)")
    b.set(title="server CPU per reply", xlabel="offered rate (req/s)", ylabel="µs / reply")
    c.set(title="load generator / other work (% of one core)", xlabel="offered rate (req/s)",
          ylabel="%")
    for ax in (a, b):
        ax.legend(fontsize=7)
    c.legend(fontsize=6)
    return _save(fig, out / "fig1-reply-vs-offered.png")


def reactors_idle(rows: list[Row], out: Path) -> Path:
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.8))
    a, b, c, d = axes
    fixed = None
    for reactor, color in COLORS.items():
        for kind, style in (("subscribe", "-"), ("publish", "--")):
            pts = matching(rows, experiment="reactors", reactor=reactor, kind=kind)
            if not pts:
                continue
            fixed = fixed or _fixed_rate(pts)
            pts = sorted(matching(pts, offered_rate=_fixed_rate(pts)), key=lambda r: r["idle"])
            xs = [r["idle"] for r in pts]
            label = f"{reactor} {kind}"
            a.errorbar(xs, [r["reply_rate"] for r in pts],
                       yerr=[[r["reply_rate"] - r["reply_rate_min"] for r in pts],
                             [r["reply_rate_max"] - r["reply_rate"] for r in pts]],
                       fmt=style, color=color, marker="o", capsize=3, label=label)
            b.plot(xs, [r["server_cpu_us_per_reply"] or 0 for r in pts], style, color=color,
                   marker="o", label=label)
            c.plot(xs, [r["latency_p99_ms"] for r in pts], style, color=color, marker="o",
                   label=f"{label} p99")
            c.plot(xs, [r["latency_p50_ms"] for r in pts], style, color=color, alpha=0.4,
                   label=f"{label} p50")
            _cpu_panel(d, xs, pts, label, color, style)
    a.set(title=f"reply rate at {fixed} req/s offered vs idle held polls\n"
                "(median of repetitions, bars: min-max)",
          xlabel="idle held polls N", ylabel="reply rate (replies/s)")
    b.set(title="server CPU per reply", xlabel="idle held polls N", ylabel="µs / reply")
    c.set(title="latency", xlabel="idle held polls N", ylabel="ms", yscale="log")
    d.set(title="load generator / other work (% of one core)", xlabel="idle held polls N",
          ylabel="%")
    for ax in axes:
        ax.legend(fontsize=6)
    return _save(fig, out / "fig2-reply-vs-idle.png")


def _fixed_rate(pts: list[Row]) -> Any:
    """The offered rate measured at every N (the plan's, when the rows name it)."""
    if "fixed_rate" in pts[0]:
        return pts[0]["fixed_rate"]
    rates = [r["offered_rate"] for r in pts]
    ns = {r["idle"] for r in pts}
    return max(set(rates), key=lambda x: (len({r["idle"] for r in pts
                                              if r["offered_rate"] == x}) == len(ns),
                                          rates.count(x)))


def syscalls(rows: list[Row], out: Path) -> Path:
    traces = matching(rows, experiment="strace")
    names = sorted({k for r in traces for k in r["syscalls_per_reply"]})
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / max(len(traces), 1)
    for i, r in enumerate(traces):
        xs = [j + i * width for j in range(len(names))]
        ax.bar(xs, [r["syscalls_per_reply"].get(n, 0) for n in names], width,
               color=COLORS.get(r["reactor"], "grey"),
               label=f"{r['reactor']} N={r['idle']} ({r['strace_reply_rate']}/s under strace)")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=30)
    ax.set(title="system calls per reply (strace -c -f, pull subscribes)", ylabel="calls / reply")
    ax.legend(fontsize=7)
    return _save(fig, out / "fig3-syscalls.png")


def wan_mtu(rows: list[Row], out: Path) -> list[Path]:
    pts_all = matching(rows, experiment="wan", series="mtu")
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.8))
    fig2, (d, e) = plt.subplots(1, 2, figsize=(11, 4.8))
    for size in sorted({r["size"] for r in pts_all}):
        pts = sorted(matching(pts_all, size=size), key=lambda r: r["mtu"])
        xs = [r["mtu"] for r in pts]
        color = SIZE_COLORS.get(size, "grey")
        a.plot(xs, [r["server_cpu_us_per_delivery"] for r in pts], "-", marker="o",
               color=color, label=f"{size} B total")
        a.plot(xs, [r["server_sys_us_per_delivery"] for r in pts], "--", color=color,
               label=f"{size} B kernel part")
        b.plot(xs, [r["packets_per_delivery"] for r in pts], "-", marker="o", color=color,
               label=f"{size} B veth packets")
        b.plot(xs, [r["tcp_segments_per_delivery"] for r in pts], ":", color=color,
               label=f"{size} B TCP segments")
        _cpu_panel(c, xs, pts, f"{size} B", color)
        d.plot(xs, [r["trip_p50_ms"] for r in pts], "-", marker="o", color=color,
               label=f"{size} B median")
        d.plot(xs, [r["trip_last_ms"] for r in pts], "--", color=color, label=f"{size} B last")
        _cpu_panel(e, xs, pts, f"{size} B", color)
    subs = pts_all[0]["subscribers"] if pts_all else 0
    a.set(title=f"server CPU per delivery vs MTU ({subs} held polls, re-polls included)",
          xlabel="MTU (bytes)", ylabel="µs / delivery")
    b.set(title="packets per delivery vs MTU (both directions)", xlabel="MTU (bytes)",
          ylabel="packets / delivery")
    for ax in (c, e):
        ax.set(title="load generator / other work (% of one core)", xlabel="MTU (bytes)",
               ylabel="%")
    d.set(title="fan-out trip time vs MTU", xlabel="MTU (bytes)", ylabel="ms")
    for ax in (a, b, c, d, e):
        ax.legend(fontsize=7)
    return [_save(fig, out / "fig4-wan-cpu-packets-vs-mtu.png"),
            _save(fig2, out / "fig5-wan-trip-vs-mtu.png")]


def wan_caps(rows: list[Row], out: Path) -> Path:
    pts = matching(rows, experiment="wan", series="cap")
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4.8))
    labels = [r["cap"] for r in pts]
    xs = list(range(len(pts)))
    a.plot(xs, [r["trip_p50_ms"] for r in pts], "-o", label="median")
    a.plot(xs, [r["trip_last_ms"] for r in pts], "--o", label="last subscriber")
    b.plot(xs, [r["server_cpu_us_per_delivery"] for r in pts], "-o", label="total")
    b.plot(xs, [r["server_sys_us_per_delivery"] for r in pts], "--o", label="kernel part")
    _cpu_panel(c, xs, pts, "", "tab:blue")
    size = pts[0]["size"] if pts else 0
    for ax, title, unit in ((a, "fan-out trip time vs tbf cap", "ms"),
                            (b, "server CPU per delivery vs tbf cap", "µs / delivery"),
                            (c, "load generator / other work (% of one core)", "%")):
        ax.set_xticks(xs, labels)
        ax.set(title=f"{title} (MTU 1500, {size} B)", xlabel="bandwidth cap", ylabel=unit)
        ax.legend(fontsize=7)
    return _save(fig, out / "fig6-wan-vs-bandwidth.png")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def redraw(folder: Path) -> list[Path]:
    """Draw the figures again from `folder`/results.jsonl."""
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    return draw(rows, folder)


def draw(rows: list[Row], out: Path) -> list[Path]:
    paths = []
    if matching(rows, experiment="reactors"):
        paths += [reactors_offered(rows, out), reactors_idle(rows, out)]
    if matching(rows, experiment="strace"):
        paths.append(syscalls(rows, out))
    if matching(rows, experiment="wan"):
        paths += wan_mtu(rows, out)
        paths.append(wan_caps(rows, out))
    return paths


if __name__ == "__main__":
    for p in redraw(Path(sys.argv[1])):
        print(p)
