"""Cluster publish capacity (issues 28 and 37) at tiny scale, for real.

Runs ``python -m loadtest.bench --quick --only capacity`` in a subprocess: 1 and
2 nodes, each in a CPU cgroup the run makes and removes, behind a real HAProxy
(by channel, sticky, round robin), on a real redis-server and on the mesh, with
the open-loop publisher and the many-channel subscribers of the raw-epoll
client; issue 28's workload (channels x 3 polls) in every mode, issue 37's (one
poll a channel) with channel-affine balancing only. Checks that every
configuration produced a capacity from steps that really passed (every publish
201, every subscriber of its channel reached), that the polls were spread over
the nodes, that every part's CPU was recorded, that the tables and the ratios
against their targets were printed, and that no group is left behind. It asserts
no timing. And the pure parts: workloads named on the command line, which
(workload, mode) pairs run, the runs the polls are opened in, the verdicts.
"""

from __future__ import annotations

import json

import pytest

from deploy.launch import haproxy_config
from loadtest.bench.__main__ import parse_args
from loadtest.bench.capacity import (
    FOLLOW_CHUNK,
    HAPROXY_POLLS,
    HOLD_S,
    MODES,
    WORKLOADS,
    Workload,
    follow_chunks,
    haproxies_for,
    held_again,
    parse_workload,
    plan,
    verdict,
)
from loadtest.bench.cluster import NODE_ARGS
from loadtest.bench.report import capacity_rows
from loadtest.cgroups import CPU_ROOT
from tests.loadtest.quick_bench import run_quick_bench


def test_a_workload_is_channels_x_polls() -> None:
    assert parse_workload("19000x1") == Workload(19000, 1)
    assert parse_workload(" 1000X3 ").name == "1000x3"
    for bad in ("19000", "x1", "19000x", "ax1", "0x3", "10x0", "-1x3", "10x3x2"):
        with pytest.raises(ValueError, match="workload"):
            parse_workload(bad)


def test_the_flags_choose_workloads_node_counts_and_step() -> None:
    args = parse_args(["--only", "capacity", "--capacity-workload", "19000x1,50x2,19000X1",
                       "--capacity-nodes", "1,4", "--capacity-step", "3"])
    assert args.capacity_workload == [Workload(19000, 1), Workload(50, 2)]
    assert args.capacity_nodes == (1, 4) and args.capacity_step == 3.0
    assert parse_args(["--only", "interest", "--interest-widths", "20,8000"]
                      ).interest_widths == (20, 8000)
    for bad in (["--capacity-workload", "19000"], ["--capacity-nodes", "0"],
                ["--capacity-nodes", "two"], ["--capacity-step", "0"],
                ["--interest-widths", ""]):
        with pytest.raises(SystemExit) as exit_:
            parse_args(bad)
        assert exit_.value.code == 2


def test_the_default_runs_one_poll_a_channel_with_channel_affinity_only() -> None:
    pairs = [(w.name, m) for w, m in plan(WORKLOADS, tuple(MODES))]
    assert pairs == [("1000x3", m) for m in MODES] + [("19000x1", "redis-affine")]
    # a workload named on the command line runs in every mode selected
    assert plan((Workload(5, 1),), ("mesh", "redis-sticky")) == [
        (Workload(5, 1), "mesh"), (Workload(5, 1), "redis-sticky")]
    assert plan(WORKLOADS, ("mesh",)) == [(WORKLOADS[0], "mesh")]


def test_polls_are_opened_in_runs_of_about_a_chunk_each() -> None:
    users = [f"u{i}" for i in range(19000)]
    runs = follow_chunks(users, 1)
    assert [len(r) for r in runs] == [FOLLOW_CHUNK] * (19000 // FOLLOW_CHUNK) + [
        19000 % FOLLOW_CHUNK]
    assert [ch for r in runs for ch in r] == users  # each once, in order
    assert {len(r) for r in follow_chunks(users[:1000], 3)[:-1]} == {FOLLOW_CHUNK // 3}
    assert follow_chunks(["a", "b"], 1000) == [["a"], ["b"]]  # at least a channel a run
    assert follow_chunks([], 3) == []


def test_enough_haproxy_processes_to_hold_every_poll() -> None:
    assert haproxies_for(0) == haproxies_for(3000) == haproxies_for(HAPROXY_POLLS) == 1
    assert haproxies_for(HAPROXY_POLLS + 1) == 2
    assert haproxies_for(19000) == 3  # one holds about 10,000 under 20,000 fds


def test_no_poll_times_out_while_rates_are_measured() -> None:
    """Polls ask to be held past a configuration's run, the nodes hold them as
    long and HAProxy carries them as long: no wave of timed-out polls falls
    into some steps and not others."""
    assert HOLD_S >= 1800
    assert int(NODE_ARGS[NODE_ARGS.index("--max-timeout") + 1]) >= HOLD_S
    cfg = haproxy_config(8000, [8001, 8002], balance="channel", longest_poll_s=HOLD_S)
    assert "timeout client 1830s" in cfg and "timeout server 1830s" in cfg
    assert "150s" not in cfg
    assert "timeout client 150s" in haproxy_config(8000, [8001])  # the shipped default


def test_a_step_starts_with_all_but_a_few_re_polls_held() -> None:
    assert held_again(150, 150) and held_again(151, 150)
    assert not held_again(149, 150)  # under 200 polls: every one
    assert held_again(299, 300) and not held_again(298, 300)
    assert held_again(18905, 19000) and not held_again(18904, 19000)


def test_a_ratio_meets_its_target_or_says_by_how_much_it_missed() -> None:
    assert verdict(1.9, 1.8) == "met" and verdict(1.8, 1.8) == "met"
    assert verdict(1.7, 3.4) == "MISSED (2.00x)"
    assert verdict(None, 1.8) == "no figure" and verdict(2.0, None) == "-"
    row = {"capacity": 100.0, "at_capacity": {"cpu_pct": {"node1": 10.0, "node2": 9.5,
                                                          "generator": 30.0}}}
    res = {"workloads": {"19000x1": {"modes": {"redis-affine": {
        "1": {**row, "capacity": 60.0, "ratio_to_1": 1.0, "target_ratio": None},
        "2": {**row, "ratio_to_1": 1.67, "target_ratio": 1.8}}}}}}
    [r] = capacity_rows(res, targets_apply=True)
    assert r["figure"] == "capacity 19000x1 redis-affine: 2 nodes / 1"
    assert r["verdict"] == "MISSED (1.08x)" and r["target_text"] == ">= 1.80x"
    assert r["generator_cpu"] == "30% of a core" and "100.0 against 60.0" in r["note"]
    assert capacity_rows(res, targets_apply=False)[0]["verdict"] == ""


@pytest.mark.timeout(200)
def test_quick_capacity_of_one_and_two_nodes_in_every_mode() -> None:
    # ten configurations (about 90 s on a loaded 2-core machine)
    stdout, path = run_quick_bench("--only", "capacity", "--front-shares", "2048",
                                   timeout=180)
    stamp = path.stem.removeprefix("bench-")
    res = json.loads(path.read_text())["results"]["capacity"]
    assert "error" not in res, res["error"]
    assert list(res["workloads"]) == ["100x3", "300x1"]
    assert set(res["workloads"]["100x3"]["modes"]) == set(MODES)
    assert set(res["workloads"]["300x1"]["modes"]) == {"redis-affine"}
    assert stdout.count("CPU budgets: 0.1 core per node (cgroup v1") == 2 * (len(MODES) + 1)
    for wl in res["workloads"].values():
        _check_workload(wl, stdout)
    for name in ("100x3", "300x1"):  # issue 37's targets, printed per workload
        assert f"capacity {name} redis-affine: 2 nodes / 1" in stdout
    assert sorted(p.name for p in CPU_ROOT.glob(f"pushup-{stamp}-*")) == []


def _check_workload(wl: dict, stdout: str) -> None:
    channels, per_channel = wl["channels"], wl["per_channel"]
    assert f"Publish capacity: {channels:,} channels x {per_channel} long polls" in stdout
    for mode, rows in wl["modes"].items():
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
        assert rows["2"]["target_ratio"] == {"redis-affine": 1.8, "redis-sticky": 1.7,
                                             "redis-publish-only": 1.9}.get(mode)
        assert f"| {mode} | 2 |" in stdout
