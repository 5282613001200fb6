"""The soak, at tiny scale, for real: ``python -m loadtest.bench --quick --only soak``.

Fifteen seconds of 500 re-polling subscribers on 10 channels against a fresh
`pushup serve`: checks that every subscriber got every publish of its channel
once, that RSS was sampled over the run and printed as lines, and that the
record and the table carry the slope and both processes' CPU. It asserts no
slope: fifteen seconds on a shared machine say nothing about a leak (the full
run does; docs name its figures).
"""

from __future__ import annotations

import json

import pytest

from loadtest.bench.soak import slope_mb_per_min
from tests.loadtest.quick_bench import run_quick_bench


def test_the_slope_is_least_squares_in_mb_per_minute() -> None:
    mb = 2**20
    rising = [(t, 100 * mb + t * mb // 30) for t in range(0, 300, 5)]  # 2 MB a minute
    assert slope_mb_per_min(rising) == pytest.approx(2.0, rel=1e-3)
    assert slope_mb_per_min([(t, 80 * mb) for t in range(0, 300, 5)]) == 0.0
    assert slope_mb_per_min([(0.0, mb)]) == 0.0


@pytest.mark.timeout(150)
def test_quick_soak_delivers_everything_once_and_reports_rss_over_time() -> None:
    stdout, path = run_quick_bench("--only", "soak")
    res = json.loads(path.read_text())["results"]["soak"]
    assert "error" not in res, res["error"]
    assert res["subscribers"] == 500 and res["channels"] == 10
    d = res["deliveries"]
    assert d["publishes"] > 0 and d["expected"] == d["received"] > 0
    assert (d["duplicate"], d["missed"], d["dropped"]) == (0, 0, 0)
    assert res["delivered_pct"] == 100.0
    # RSS sampled from the start to the end of the run, a line per quarter of it
    assert len(res["samples"]) >= 10 and res["samples"][0][0] == 0.0
    assert len(res["lines"]) >= 3
    assert all(line["rss_mb"] > 0 and line["generator_cpu_pct"] >= 0 for line in res["lines"])
    assert isinstance(res["slope_last_half_mb_per_min"], float)
    assert res["generator_cpu_pct"] > 0 and res["server_cpu_pct"] > 0
    assert "soak: RSS slope over the last half" in stdout
    assert "soak: delivered once" in stdout
