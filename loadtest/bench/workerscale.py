"""`--workers 2` against one process, each process with a CPU budget of its own.

On this 2-core machine the load generator needs as much CPU per delivery as
PushUp does, so unbudgeted (`--only nchan`) two workers and the generator
share the same two cores and the workers cannot show what a core each buys.
Here every serving process gets its own cgroup v1 CPU group of `--budget`
cores (loadtest/cgroups.py), as the paper's nodes each had a machine: one
process gets one budget, each of two workers one budget (the supervisor,
which only watches them, none); the generator stays outside every budget,
with CPU to spare. The same fan-out (N subscribers on one channel, one
publish a second, re-polling on receipt) and publish rate (8 keep-alive
publishers) as `--only nchan`, by the same code (scenarios.py), then the
ratios the issue asks of `--workers 2`: publishes/s >= 1.3x and fan-out
last-subscriber p50 <= 0.8x one process. Without writable cgroups the run
goes on unbudgeted and says so.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from loadtest import cgroups

from . import scenarios
from .compare import PACE_S, PUSHUP_1, PUSHUP_2
from .engines import fmt
from .report import grid
from .scenarios import Context
from .server import Server

TARGETS = [PUSHUP_1, PUSHUP_2]


def bench_worker_scaling(ctx: Context, n: int, publishes: int, round_timeout: float,
                         publishers: int, publish_seconds: float, reps: int,
                         cores: float) -> dict[str, Any]:
    run = f"{ctx.stamp}-{os.getpid()}-workers"
    with cgroups.CpuBudgets(run, cores, log=ctx.log) as budgets:
        def budget(srv: Server) -> None:
            # One group per serving process: a worker, or the one process.
            serving = [p for p in srv.pids if p != srv.pid] if srv.workers > 1 else [srv.pid]
            for i, pid in enumerate(serving):
                budgets.assign(f"process{i}", pid)

        budgeted = replace(ctx, on_serving=budget)
        out: dict[str, Any] = {"labels": {t.key: t.label for t in TARGETS},
                               "budget_cores": cores if budgets.available else None,
                               "budget_note": budgets.reason or None,
                               "subscribers": n, "publishes": publishes,
                               "publishers": publishers, "fanout": {}, "publish": {}}
        for target in TARGETS:
            ctx.log(f"  -- fan-out: {target.label}")
            out["fanout"][target.key] = scenarios.bench_fanout(
                budgeted, "workers-fanout", n, publishes, round_timeout, True, target,
                pace_s=PACE_S)
            ctx.log(f"  -- publish: {target.label}")
            out["publish"][target.key] = scenarios.bench_publish(
                budgeted, publishers, publish_seconds, reps, target)
        out["throttling"] = budgets.throttling()
    return out


def rows(res: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(figure, one process, --workers 2, ratio, target) for the table."""
    one, two = PUSHUP_1.key, PUSHUP_2.key
    fan, pub = res["fanout"], res["publish"]

    def ms(r: dict[str, Any], key: str) -> float | None:
        return None if r.get(key) is None else 1000 * r[key]

    def latency(r: dict[str, Any]) -> float | None:
        p50 = sorted(s["latency_p50_ms"] for s in r.get("samples", [])
                     if s.get("latency_p50_ms") is not None)
        return p50[len(p50) // 2] if p50 else None

    figures = [
        ("fan-out: last subscriber p50", ms(fan[one], "last_p50_s"),
         ms(fan[two], "last_p50_s"), "ms", "<= 0.80x"),
        ("fan-out: delivered", fan[one].get("delivered_pct"), fan[two].get("delivered_pct"),
         "%", "100 %"),
        ("publishes/s, keep-alive publishers", pub[one].get("median_per_second"),
         pub[two].get("median_per_second"), "/s", ">= 1.30x"),
        ("publish answered p50", latency(pub[one]), latency(pub[two]), "ms", ""),
    ]
    out = []
    for label, a, b, unit, target in figures:
        ratio = f"{b / a:.2f}x" if a and b is not None else "-"
        out.append((label, fmt(a, unit), fmt(b, unit), ratio, target))
    for key in (one, two):
        u = fan[key].get("usage_all_publishes")
        if u:
            out.append((f"fan-out CPU, {res['labels'][key]}", f"server {u['server_cpu_pct']}%",
                        f"generator {u['generator_cpu_pct']}%", "", "of a core"))
        if pub[key].get("samples"):
            out.append((f"publish CPU, {res['labels'][key]}",
                        f"server {pub[key]['server_cpu_pct_median']}%",
                        f"generator {pub[key]['generator_cpu_pct_median']}%", "", "of a core"))
    return out


def table(res: dict[str, Any]) -> str:
    budget = (f"{res['budget_cores']:g} core per serving process" if res.get("budget_cores")
              else f"NO budgets ({res.get('budget_note')})")
    lines = [f"--workers 2 against one process, {budget}; {res['subscribers']} subscribers, "
             f"{res['publishes']} publishes; {res['publishers']} publishers", ""]
    lines += grid(["figure", "one process", "--workers 2", "ratio", "target"],
                  [list(r) for r in rows(res)])
    return "\n".join(lines)
