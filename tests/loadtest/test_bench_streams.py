"""Durable Streams against /subscribe at tiny scale, for real:
``python -m loadtest.bench --quick --only streams``.

One `pushup serve`: a channel and a stream holding the same 20 messages read
back whole by catch-up reads on both paths, then 200 long polls on each woken
by two publishes or appends. Checks that every read and every long poll was
answered (the scenario itself checks both reads return all 20 messages and
raises on a poll left unanswered), that both processes' CPU is recorded, and
that the table with the ratios is printed. It asserts no timing.
"""

from __future__ import annotations

import json

import pytest

from tests.loadtest.quick_bench import run_quick_bench


@pytest.mark.timeout(150)
def test_quick_streams_against_subscribe_answers_every_read_and_long_poll() -> None:
    stdout, path = run_quick_bench("--only", "streams")
    res = json.loads(path.read_text())["results"]["streams"]
    assert "error" not in res, res["error"]
    reads = res["catch_up"]["20"]
    for side in ("subscribe", "stream"):
        (sample,) = reads[side]["samples"]
        assert sample["reads"] > 0
        assert {"server_us_per_read", "generator_us_per_read"} <= sample.keys()
    wake = res["wake_up"]["200"]
    for side in ("subscribe", "stream"):
        assert wake[side]["long_polls"] == 200 and wake[side]["rounds"] == 2
        assert wake[side]["trip_p50_ms"] > 0
        assert wake[side]["client_counters"]["poll_responses"] == 400
        assert wake[side]["client_counters"] == {"poll_responses": 400}
    assert "Durable Streams against /subscribe" in stdout
    assert "catch-up read of 20 messages: CPU/read" in stdout
    assert "wake-up of 200 long polls: trip p50" in stdout
