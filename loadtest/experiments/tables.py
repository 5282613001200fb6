"""Markdown tables of a results.jsonl: `python -m loadtest.experiments.tables DIR`.

The README beside the committed results quotes these tables; printing them
from the JSON lines keeps every number there traceable to a measured row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .figures import matching

Row = dict[str, Any]


def _table(head: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def idle_table(rows: list[Row]) -> str:
    out = []
    for r in sorted(matching(rows, experiment="reactors"),
                    key=lambda r: (r["reactor"], r["kind"], r["idle"], r["offered_rate"])):
        if r["offered_rate"] != r.get("fixed_rate"):
            continue
        out.append([r["reactor"], r["kind"], r["idle"], f"{r['reply_rate']:.0f} "
                    f"({r['reply_rate_min']:.0f}–{r['reply_rate_max']:.0f})",
                    f"{r['latency_p50_ms']:.2f}", f"{r['latency_p99_ms']:.1f}",
                    f"{r['server_cpu_us_per_reply']:.0f}", _share(r["server_user_share"]),
                    f"{r['server_cpu_pct']:.0f} %", f"{r['generator_cpu_pct']:.0f} %",
                    f"{r['others_cpu_pct']:.0f} %"])
    fixed = next((r["fixed_rate"] for r in rows if "fixed_rate" in r), "?")
    return f"At {fixed} requests/s offered (median of repetitions, min–max):\n\n" + _table(
        ["reactor", "workload", "idle N", "reply rate /s", "p50 ms", "p99 ms",
         "server µs/reply", "user share", "server CPU", "generator CPU", "others CPU"], out)


def sweep_table(rows: list[Row]) -> str:
    out = []
    for reactor in ("select", "poll", "epoll"):
        pts = matching(rows, experiment="reactors", reactor=reactor, kind="subscribe")
        ns = sorted({r["idle"] for r in pts})
        for n in (ns[:1] + ns[-1:]) if ns else []:
            sweep = sorted(matching(pts, idle=n), key=lambda r: r["offered_rate"])
            if len(sweep) < 3:
                continue
            best = max(sweep, key=lambda r: r["reply_rate"])
            cells = " · ".join(f"{r['offered_rate'] / 1000:g}k→{r['reply_rate'] / 1000:.1f}k"
                               for r in sweep)
            out.append([reactor, n, f"{best['reply_rate']:.0f}", cells])
    return _table(["reactor", "idle N", "highest reply rate /s", "offered → reply"], out)


def strace_table(rows: list[Row]) -> str:
    out = []
    for r in matching(rows, experiment="strace"):
        per = r["syscalls_per_reply"]
        wait = sum(per.get(k, 0) for k in ("select", "pselect6", "poll", "ppoll", "epoll_wait"))
        out.append([r["reactor"], r["idle"], f"{wait:.3f}", f"{per.get('epoll_ctl', 0):.3f}",
                    f"{per.get('recvfrom', 0):.2f}", f"{per.get('sendto', 0):.2f}",
                    f"{r['strace_reply_rate']:.0f} of {r['strace_offered_rate']}"])
    return _table(["reactor", "idle N", "wait calls/reply", "epoll_ctl/reply", "recvfrom/reply",
                   "sendto/reply", "replies/s under strace"], out)


def wan_table(rows: list[Row], series: str) -> str:
    out = []
    for r in matching(rows, experiment="wan", series=series):
        out.append([r["mtu"], r["cap"], r["size"], r["server_cpu_us_per_delivery"],
                    r["server_user_us_per_delivery"], r["server_sys_us_per_delivery"],
                    r["packets_per_delivery"], r["tx_packets_per_delivery"],
                    r["tcp_segments_per_delivery"], r["trip_p50_ms"], r["trip_last_ms"],
                    r["retrans_segments"], r.get("qdisc_drops", "not recorded"),
                    f"{r['generator_cpu_pct']:.0f} %",
                    f"{r['others_cpu_pct']:.0f} %"])
    return _table(["MTU", "cap", "bytes", "server µs/delivery", "user", "kernel",
                   "packets/delivery", "to subscribers", "TCP segments", "trip p50 ms",
                   "trip last ms", "retransmits", "qdisc drops", "generator CPU",
                   "others CPU"], out)


def render(rows: list[Row]) -> str:
    machine = next((r for r in rows if r["experiment"] == "machine"), {})
    end = next((r for r in rows if r["experiment"] == "machine-end"), {})
    parts = [f"Run {machine.get('stamp')} ({machine.get('profile')}), {machine.get('cpus')} CPUs, "
             f"kernel {machine.get('kernel')}, Python {machine.get('python')}; load average "
             f"at start {machine.get('loadavg')}, at end {end.get('loadavg')}, "
             f"{end.get('elapsed_s')} s."]
    if matching(rows, experiment="reactors"):
        parts += ["### Reply rate at a fixed offered rate vs idle held polls", idle_table(rows),
                  "### Offered-rate sweeps (pull subscribes)", sweep_table(rows)]
    if matching(rows, experiment="strace"):
        parts += ["### System calls per reply (strace -c -f)", strace_table(rows)]
    if matching(rows, experiment="wan"):
        parts += ["### Fan-out vs MTU", wan_table(rows, "mtu"),
                  "### Fan-out vs bandwidth cap (tbf)", wan_table(rows, "cap")]
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    print(render([json.loads(line)
                  for line in (folder / "results.jsonl").read_text().splitlines()]))


def _share(share: float | None) -> str:
    """The user share of the server's CPU; none when the window saw no CPU
    tick (an idle smoke run can measure 0 s of server CPU)."""
    return "–" if share is None else f"{100 * share:.0f} %"
