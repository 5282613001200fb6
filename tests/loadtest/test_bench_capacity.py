"""Cluster publish capacity (issue 28's scenario) at tiny scale, for real.

Runs ``python -m loadtest.bench --quick --only capacity`` in a subprocess: 1 and
2 nodes, each in a CPU cgroup the run makes and removes, behind a real HAProxy
(by channel, sticky, round robin), on a real redis-server and on the mesh, with
the open-loop publisher and the many-channel subscribers of the raw-epoll
client. Checks that every configuration produced a capacity from steps that
really passed (every publish 201, every subscriber of its channel reached),
that the polls were spread over the nodes, that every part's CPU was recorded,
that the table was printed, and that no group is left behind. It asserts no
timing.
"""

from __future__ import annotations

import json

import pytest

from loadtest.bench.capacity import MODES
from loadtest.cgroups import CPU_ROOT
from tests.loadtest.quick_bench import run_quick_bench


@pytest.mark.timeout(150)
def test_quick_capacity_of_one_and_two_nodes_in_every_mode() -> None:
    stdout, path = run_quick_bench("--only", "capacity", "--front-shares", "2048")
    stamp = path.stem.removeprefix("bench-")
    res = json.loads(path.read_text())["results"]["capacity"]
    assert "error" not in res, res["error"]
    assert set(res["modes"]) == set(MODES)
    assert stdout.count("CPU budgets: 0.1 core per node (cgroup v1") == 2 * len(MODES)
    channels, per_channel = res["settings"]["channels"], res["settings"]["per_channel"]
    for mode, rows in res["modes"].items():
        engine, _, subscribed = MODES[mode]
        assert set(rows) == {"1", "2"}
        for k, row in rows.items():
            assert row["budget_cores"] == 0.1 and row["budget_note"] is None
            assert row["capacity"] > 0, (mode, k, row["steps"])
            best = row["at_capacity"]
            assert best["pass"] and best["rate"] == row["capacity"]
            assert best["answered_201"] == best["offered"] > 0
            assert best["unsent"] == 0 and best["unanswered"] == 0
            nodes = [f"node{i + 1}" for i in range(int(k))]
            assert sorted(best["throttled"]) == sorted([*nodes, "front"])
            assert set(best["cpu_pct"]) == {*nodes, "haproxy", "redis", "generator"}
            assert best["cpu_pct"]["generator"] > 0
            assert (best["cpu_pct"]["redis"] > 0) == (engine == "redis")
            if engine == "redis" and subscribed:  # each follows its clients' partitions
                assert all(f > 0 for f in best["followed_partitions"])
            elif engine == "redis":  # a publish alone makes a node follow nothing
                assert best["followed_partitions"] == [0] * int(k)
            else:
                assert best["followed_partitions"] == [None] * int(k)
            if subscribed:
                assert row["subscribers"] == channels * per_channel
                assert sum(row["held_per_node"]) == row["subscribers"]
                assert min(row["held_per_node"]) > 0  # HAProxy spread the polls
                assert best["delivered_pct"] == 100.0
                assert best["client_counters"].get("duplicate", 0) == 0
                assert 0 < best["trip_p50_s"] <= best["trip_p99_s"]
            else:
                assert row["subscribers"] == 0 and best["delivered_pct"] is None
                assert 0 < best["publish_p50_s"] <= best["publish_p99_s"]
        assert rows["1"]["ratio_to_1"] == 1.0 and rows["2"]["ratio_to_1"] > 0
        assert f"| {mode} | 2 |" in stdout
    assert sorted(p.name for p in CPU_ROOT.glob(f"pushup-{stamp}-*")) == []
