"""The quick profile at tiny scale, for real: a PushUp node, Locust, the counters.

Runs ``python -m loadtest.paper.run`` in a subprocess (Locust is never imported
into this process) with a few subscribers and a few seconds per point, then
checks that every metric is present and sane.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.netcount import available

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(90)
def test_quick_profile_tiny(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "loadtest.paper.run", "--profile", "quick", "--modes", "elp",
         "--cc", "3", "--intervals", "2", "--conns", "8", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=80)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ETA" in r.stdout  # progress is shown while it runs
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert rows and not [row for row in rows if "error" in row]
    grid = [row for row in rows if row["experiment"] == "grid" and row["tag"] == "2"]
    scale = [row for row in rows if row["experiment"] == "scale"]
    assert len(grid) == 1 and len(scale) == 1
    for row in grid + scale:
        assert row["connected"] == row["users"]
        assert row["published"] == row["scheduled"] >= 1
        assert row["received"] == row["expected"] == row["scheduled"] * row["users"]
        assert row["rmp_pct"] == row["rmp_published_pct"] == 100.0
        assert row["duplicates"] == 0 and row["gaps_seen"] == 0
        assert 0 <= row["mpt_mean_s"] < 2 and row["mpt_p99_s"] is not None
        assert row["mpt_p50_s"] <= row["mpt_p99_s"] + 0.01
        assert row["smu_peak_mb"] > 0 and row["smu_hold_mb"] > 0
        assert row["server_cpu_pct"] is not None and row["gen_cpu_pct"] is not None
        assert row["server_stats"]["published"] == sum(
            r["published"] for r in rows if r["experiment"] == row["experiment"])
    if available():
        assert grid[0]["nt_note"]
    else:
        nt = grid[0]["nt"]
        assert nt["up_bytes"] > 0 and nt["down_bytes"] > 0 and nt["packets"] > 0
        assert grid[0]["nt_total"]["bytes"] >= nt["bytes"]
    report = (tmp_path / "report.md").read_text()
    assert "Table 1" in report and "Table 2" in report
    assert (tmp_path / "fig7_nt.png").stat().st_size > 0
    assert (tmp_path / "fig9_smu.png").stat().st_size > 0
