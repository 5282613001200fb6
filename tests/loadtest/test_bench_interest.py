"""Issue 37's delivery-by-interest figure, at tiny scale, for real.

Runs ``python -m loadtest.bench --quick --only interest --interest-widths 50`` in a
subprocess: a real 3-primary Redis Cluster, two real nodes on it, 50 long polls
held on node B by the raw-epoll workers, 8 keep-alive publishers on node A over
1,000 other channels. Checks that every poll was held, that none was answered
(no message of A's reached B's clients), that A published, that A's, B's,
Redis's and the generator's CPU, B's RSS and the partitions it follows were
recorded and printed beside the target, and that nothing it started is left.
It asserts no figure's size: one run on a shared machine says nothing of a
ratio (``make bench`` does). And the pure parts it stands on: when B is quiet,
the ratio, and the report's rows.
"""

from __future__ import annotations

import json

import pytest

from loadtest.bench.interest import TARGET, quiet, ratio, table
from loadtest.bench.report import interest_rows
from tests.loadtest.quick_bench import run_quick_bench
from tests.toolkit import alive


def test_quiet_needs_the_whole_span_with_the_cpu_flat_over_its_end() -> None:
    assert not quiet([])
    assert not quiet([(0.0, 1.0), (0.4, 1.0)])  # not yet half a second seen
    assert quiet([(0.0, 1.0), (0.3, 1.0), (0.6, 1.01)])  # one tick is noise
    assert not quiet([(0.0, 1.0), (0.3, 1.1), (0.6, 1.1)])  # busy within the last 0.5 s
    # busy long ago, flat since: quiet (only the last 0.5 s count)
    assert quiet([(0.0, 1.0), (0.2, 2.0), (0.5, 2.0), (0.8, 2.0)])
    assert not quiet([(0.0, 1.0), (0.2, 2.0), (0.5, 2.0), (0.8, 2.0)], quiet_s=0.7)


def test_the_ratio_is_b_over_a_and_none_without_a_cost_to_compare_with() -> None:
    assert ratio(0.5, 2.0) == 0.25
    assert ratio(1.0, 3.0) == 0.333
    assert ratio(0.1, 0.0) is None


def _width(b_over_a: float | None, channels: int | None = None) -> dict[str, object]:
    return {"a_cpu_s": 2.0, "b_cpu_s": 0.4, "b_over_a": b_over_a, "generator_cpu_s": 0.5,
            "generator_cpu_pct": 10.0, "per_second": 1234.0, "b_followed": 7,
            "b_channels_followed": channels, "b_rss_mb": {"held": 61.0},
            "b_rss_kb_per_channel": 5.0, "redis_cpu_s": 0.8}


def test_the_report_gives_a_verdict_per_width_against_the_target() -> None:
    res = {"target": TARGET, "widths": {"20": _width(0.05), "8000": _width(0.5, 8000),
                                        "200": {"width": 200, "error": "BenchError: x"}}}
    rows = interest_rows(res, targets_apply=True)
    assert [r["verdict"] for r in rows] == ["met", "MISSED (5.00x)", "no figure"]
    assert rows[0]["target_text"] == "<= 0.10x"
    assert "B follows 7;" in rows[0]["note"]
    assert "B follows 7 partitions, 8,000 channels" in rows[1]["note"]
    assert "ERROR" in rows[2]["figure"]
    quick = interest_rows(res, targets_apply=False)
    assert [r["verdict"] for r in quick] == ["", "", "no figure"]
    assert interest_rows({"error": "x"}, True) == [] and interest_rows(None, True) == []


def test_the_table_has_a_line_per_width_and_says_which_could_not_run() -> None:
    wide = {**_width(0.5, 8000), "a_us_per_message": 400.0, "b_us_per_message": 200.0,
            "b_poll_answers": 0}
    res = {"settings": {"publishers": 8, "duration_s": 10.0, "publish_channels": 1000},
           "redis_primaries": 3, "generator": "raw-epoll client, 2 processes",
           "widths": {"8000": wide, "200": {"width": 200, "error": "BenchError: x"}}}
    lines = table(res).splitlines()
    assert lines[0].startswith("Delivery by interest (issue 37): a 3-primary Redis Cluster")
    assert "8 keep-alive publishers on A for 10 s over 1,000 other channels" in lines[0]
    [row] = [x for x in lines if x.startswith("8,000 ")]
    assert row.split() == ["8,000", "2.00", "0.40", "0.50", "<=", "0.10", "MISSED", "(5.00x)",
                           "1,234", "400", "/", "200", "0.50", "0.80", "61.0", "5.0", "7",
                           "8000", "0"]
    assert "W=200: ERROR BenchError: x" in lines


@pytest.mark.timeout(150)
def test_quick_interest_measures_a_and_b_on_a_redis_cluster() -> None:
    stdout, path = run_quick_bench("--only", "interest", "--interest-widths", "50")
    res = json.loads(path.read_text())["results"]["interest"]
    assert "error" not in res, res["error"]
    assert res["redis_primaries"] == 3 and res["target"] == TARGET
    assert list(res["widths"]) == ["50"]
    r = res["widths"]["50"]
    assert "error" not in r, r["error"]
    assert r["held_on_b"] == 50
    assert r["b_poll_answers"] == 0  # nothing of A's reached B's clients
    assert r["publishes"] > 0 and r["per_second"] > 0
    assert not [k for k in r["client_counters"] if k.startswith(("publish_status", "connect_"))]
    assert r["a_cpu_s"] > 0 and r["b_cpu_s"] >= 0 and r["redis_cpu_s"] > 0
    assert r["generator_cpu_s"] > 0
    assert r["b_over_a"] == ratio(r["b_cpu_s"], r["a_cpu_s"])
    assert r["a_us_per_message"] > 0 and r["b_us_per_message"] >= 0
    assert 0 < r["b_followed"] <= 50  # B follows its clients' partitions (or channels) only
    assert r["b_rss_mb"]["held"] > 0
    assert r["window_s"] >= 4.0  # the quick window, then until B was quiet
    assert "Delivery by interest (issue 37)" in stdout
    assert "interest: B's CPU / A's, B holding 50 channels" in stdout
    assert not [line for line in stdout.splitlines() if "ERROR" in line]
    started = res["redis_pids"] + r["node_pids"]
    assert len(started) == 5 and not [p for p in started if alive(p)]  # stopped them all
