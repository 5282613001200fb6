"""Side by side with nginx + nchan: the same scenarios, one run, back to back.

Rule: PushUp and nchan are measured by the same code — the same load client
(speaking each server's `dialect`), the same scenario functions, the same
/proc accounting over all of a server's processes — one scenario at a time,
each server right after the other, so the machine's load is as alike as a
shared machine allows. The figures that matter are the ratios.

Scenarios (scenarios.py does the measuring):

* fan-out: N subscribers on one channel, one publish a second (the next waits
  for the round to end and every re-poll to be held again), subscribers
  re-polling at once from their position; PushUp (1 process), PushUp
  `--workers 2`, nchan (1 worker);
* publish rate: 8 keep-alive publishers, no subscribers; the same three;
* RSS per held poll at N: PushUp (1 process) and nchan.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

from . import scenarios
from .nchan import nginx_binary
from .scenarios import Context, Target

PUSHUP_1 = Target("pushup-1", "PushUp (1 process)")
PUSHUP_2 = Target("pushup-2", "PushUp --workers 2", workers=2)
NCHAN = Target("nchan", "nginx + nchan (1 worker)", kind="nchan")
TARGETS = [PUSHUP_1, PUSHUP_2, NCHAN]
MEMORY_TARGETS = [PUSHUP_1, NCHAN]
PACE_S = 1.0  # fan-out: one publish a second (later when a round takes longer)


def bench_compare(ctx: Context, n: int, publishes: int, round_timeout: float,
                  publishers: int, publish_seconds: float, publish_reps: int,
                  memory_reps: int) -> dict[str, Any]:
    """{"fanout"|"publish"|"memory": {target key: result}, "labels": {key: label}}; a
    benchmark that fails is stored as {"error": ...} and the others still run."""
    nginx_binary()  # no nginx or no nchan: say so now, not after PushUp's runs
    plan: list[tuple[str, list[Target], Callable[[Target], dict[str, Any]]]] = [
        ("fanout", TARGETS, lambda t: scenarios.bench_fanout(
            ctx, "fanout", n, publishes, round_timeout, True, t, pace_s=PACE_S)),
        ("publish", TARGETS, lambda t: scenarios.bench_publish(
            ctx, publishers, publish_seconds, publish_reps, t)),
        ("memory", MEMORY_TARGETS, lambda t: scenarios.bench_memory(
            ctx, [n], memory_reps, t)[str(n)]),
    ]
    out: dict[str, Any] = {"labels": {t.key: t.label for t in TARGETS},
                           "subscribers": n, "publishes": publishes, "publishers": publishers}
    errors = []
    for scenario, targets, run in plan:
        out[scenario] = {}
        for target in targets:
            ctx.log(f"  -- {scenario}: {target.label}")
            try:
                out[scenario][target.key] = run(target)
            except Exception as e:  # one failure must not hide the other servers' figures
                traceback.print_exc()
                out[scenario][target.key] = {"error": f"{type(e).__name__}: {e}"}
                errors.append(f"{scenario}/{target.key}: {type(e).__name__}: {e}")
                try:
                    ctx.pool.close_all()
                except Exception:
                    pass
    if errors:
        out["error"] = "; ".join(errors)
    return out
