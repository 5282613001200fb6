"""The mesh-versus-Redis benchmark at tiny scale, for real: two 3-node clusters.

Runs ``python -m loadtest.bench --quick --only engines`` in a subprocess (real
nodes, a redis-server of the benchmark's own, the load workers) and checks that
every figure is there for both engines and positive, that every message reached
every subscriber, and that every process it started is gone. It asserts no timing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.loadtest.quick_bench import run_quick_bench
from tests.toolkit import alive

CLIENT_FAILURES = ("duplicate", "gap", "protocol_error", "bad_poll_body", "poll_status_",
                   "publish_status_", "connect_error", "closed_", "send_error",
                   "recv_error", "short_send")
POSITIVE = ["per_second", "publish_latency_p50_ms", "lag_idle_p50_ms", "lag_idle_p99_ms",
            "lag_loaded_p50_ms", "lag_loaded_p99_ms", "node1_us_per_message",
            "reader_us_per_message", "cluster_us_per_message"]


@pytest.mark.timeout(150)
def test_quick_mesh_and_redis_side_by_side() -> None:
    stdout, path = run_quick_bench("--only", "engines")
    assert "Mesh and Redis, 3 nodes" in stdout
    record = json.loads(path.read_text())
    res: dict[str, Any] = record["results"]["engines"]
    assert "error" not in res, res["error"]

    for engine in ("mesh", "redis"):
        e = res["engines"][engine]
        for figure in POSITIVE:
            assert e[figure] > 0, (engine, figure)
        for sample in e["samples"]:
            assert sample["ok"] > 0 and sample["messages"] >= sample["ok"]
            assert len(sample["node_us_per_message"]) == 3
            assert not [k for k in sample["client_counters"] if k.startswith(CLIENT_FAILURES)]
            assert not sample["lag_errors"]
        fan = e["fanout"]
        assert fan["nodes"] == 3 and fan["subscribers"] == res["subscribers"]
        assert fan["delivered_pct"] == 100.0
        assert fan["last_p50_s"] > 0 and fan["last_p99_s"] > 0
        assert not [p for p in e["pids"] if alive(p)]  # stopped what it started
        assert set(e["by_nodes"]) == {"1", "3"}  # --quick: one more size, 1 node
        for k, row in e["by_nodes"].items():
            assert row["per_second"] > 0 and row["node1_us_per_message"] > 0, (engine, k)
            assert row["cluster_us_per_message"] >= row["node1_us_per_message"], (engine, k)
            assert (row["reader_us_per_message"] is None) == (k == "1"), (engine, k)
            assert (row["redis_us_per_message"] is None) == (engine == "mesh"), (engine, k)

    assert res["engines"]["redis"]["redis_us_per_message"] > 0
    assert res["engines"]["mesh"]["redis_us_per_message"] is None
    for sample in res["engines"]["redis"]["samples"]:
        stats = sample["redis_commandstats"]
        # one script call per message (the lag sampler may have one publish in flight)
        assert sample["messages"] <= stats["evalsha"]["calls"] <= sample["messages"] + 1
        # and each append notified the readers (one SPUBLISH from the script)
        assert stats["spublish"]["calls"] >= sample["messages"]

    rows = record["engines_side_by_side"]
    assert len(rows) == len(res["ratios"])
    for row in rows:
        if row["figure"].startswith("redis-server"):
            assert row["values"]["redis"] > 0 and row["ratio"] is None
        else:
            assert row["ratio"] is not None and row["ratio"] > 0, row
