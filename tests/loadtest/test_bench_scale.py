"""Node scaling under per-node CPU budgets at tiny scale, for real.

Runs ``python -m loadtest.bench --quick --only scale`` in a subprocess: 1 and 2
nodes on the mesh and on Redis behind a real HAProxy, every node in a cgroup of
its own that the run makes and removes, the raw-epoll load workers. Checks that
every node got its budget, that HAProxy spread the polls over the nodes, that
every message reached every subscriber, that the figures were drawn, and that no
group is left behind. It asserts no timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.cgroups import CPU_ROOT
from tests.loadtest.quick_bench import run_quick_bench

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(150)
def test_quick_node_scaling_with_a_budget_per_node() -> None:
    stdout, path = run_quick_bench("--only", "scale", "--budget", "0.2", "--front-shares", "2048")
    stamp = path.stem.removeprefix("bench-")
    res = json.loads(path.read_text())["results"]["scale"]
    assert "error" not in res, res["error"]
    assert res["budget_cores"] == 0.2 and res["budget_note"] is None
    assert stdout.count("CPU budgets: 0.2 core per node (cgroup v1") == 4
    for engine in ("mesh", "redis"):
        rows = res["engines"][engine]
        assert set(rows) == {"1", "2"}
        for k, row in rows.items():
            nodes = [f"node{i + 1}" for i in range(int(k))]
            assert row["budget_cores"] == 0.2 and row["front_shares"] == 2048
            assert sorted(row["throttled"]) == sorted([*nodes, "front"])
            assert all(row["throttled"][n]["periods"] > 0 for n in nodes), row["throttled"]
            assert len(row["held_per_node"]) == int(k) and min(row["held_per_node"]) > 0
            assert sum(row["held_per_node"]) == res["subscribers"]
            assert row["delivered_pct"] == 100.0
            # every publish accepted: 201, or 202 when no peer confirmed it in time
            assert sum(row["publish_statuses"].values()) == res["publishes"] + 1
            assert set(row["publish_statuses"]) <= {"201", "202"}
            assert row["trip_p50_s"] > 0 and row["cpu_pct"]["generator"] >= 0
            assert row["in_fanout_cpu_pct"]["generator_busiest_process"] >= 0
    assert sorted(p.name for p in CPU_ROOT.glob(f"pushup-{stamp}-*")) == []
    figures = ROOT / "loadtest" / "out" / f"scale-{stamp}"
    assert (figures / "fig12_trip_nodes.png").stat().st_size > 0
    assert "| mesh | 2 |" in (figures / "report.md").read_text()
