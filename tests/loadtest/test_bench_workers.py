"""`--workers 2` against one process, a CPU budget per serving process, at tiny
scale, for real.

Runs ``python -m loadtest.bench --quick --only workers`` in a subprocess: one
process, then two workers, each in a cgroup of its own that the run makes and
removes, the raw-epoll load workers outside. Checks that both workers got a
budget, that every subscriber got every publish, that publishes were answered,
that the table was printed and that no group is left behind. It asserts no
timing.
"""

from __future__ import annotations

import json

import pytest

from loadtest.cgroups import CPU_ROOT
from tests.loadtest.quick_bench import run_quick_bench


@pytest.mark.timeout(150)
def test_quick_workers_against_one_process_with_a_budget_per_process() -> None:
    stdout, path = run_quick_bench("--only", "workers", "--worker-budget", "0.3")
    stamp = path.stem.removeprefix("bench-")
    res = json.loads(path.read_text())["results"]["workers"]
    assert "error" not in res, res["error"]
    assert res["budget_cores"] == 0.3 and res["budget_note"] is None
    # the one process, then each of the two workers (the supervisor has none)
    assert sorted(res["throttling"]) == ["process0", "process1"]
    assert all(t["nr_periods"] > 0 for t in res["throttling"].values()), res["throttling"]
    for key in ("pushup-1", "pushup-2"):
        assert res["fanout"][key]["delivered_pct"] == 100.0
        assert res["publish"][key]["median_per_second"] > 0
    assert "--workers 2 against one process, 0.3 core per serving process" in stdout
    assert sorted(p.name for p in CPU_ROOT.glob(f"pushup-{stamp}-*")) == []
