"""Issue 40's front latency at tiny scale, for real:
``python -m loadtest.bench --quick --only sse_latency``.

One node behind the shipped HAProxy (plain and TLS) and the shipped nginx TLS
site at once; 40 events timed on each of the six paths (HTTP/1.1, and h2
through each TLS front). Checks that every
front's every event was timed and that the table is printed. It asserts no
timing (tests/cluster/test_h2_fronts.py holds HAProxy's event to its kernel
timer's account).
"""

from __future__ import annotations

import json

import pytest

from tests.loadtest.quick_bench import run_quick_bench

FRONTS = ("straight to the node (HTTP/1.1)", "HAProxy, shipped (HTTP/1.1)",
          "HAProxy TLS, read as HTTP/1.1", "HAProxy TLS, read as h2 (curl)",
          "nginx TLS, read as HTTP/1.1", "nginx TLS, read as h2 (curl)")


@pytest.mark.timeout(150)
def test_quick_sse_latency_times_every_event_on_every_front() -> None:
    stdout, path = run_quick_bench("--only", "sse_latency")
    res = json.loads(path.read_text())["results"]["sse_latency"]
    assert "error" not in res, res["error"]
    assert list(res["fronts"]) == list(FRONTS)
    for figures in res["fronts"].values():
        assert figures["events"] == 40
        assert 0 < figures["p50_ms"] <= figures["p90_ms"] <= figures["max_ms"]
    assert "SSE, one event's latency" in stdout
    for front in FRONTS:
        assert front in stdout
