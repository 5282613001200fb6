"""The side-by-side benchmark at tiny scale, for real: PushUp, PushUp --workers 2, nginx+nchan.

Runs ``python -m loadtest.bench --quick --only nchan`` in a subprocess against
real servers and checks that every figure is present and sane (everything
delivered exactly once, rates positive, the server's own counters agreeing with
the client's). It asserts no timing. nginx and the nchan module are installed
by ``make bench-packages`` when missing; if that fails the test fails, saying so.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from loadtest.bench.nchan import NchanMissing, nginx_binary
from tests.loadtest.quick_bench import run_quick_bench

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["pushup-1", "pushup-2", "nchan"]
CLIENT_FAILURES = ("duplicate", "gap", "protocol_error", "bad_poll_body", "poll_status_",
                   "connect_error", "closed_", "send_error", "recv_error", "short_send")


def ensure_nginx_nchan() -> None:
    try:
        nginx_binary()
        return
    except NchanMissing:
        pass
    r = subprocess.run(["make", "bench-packages"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    try:
        nginx_binary()
    except NchanMissing as e:
        pytest.fail(f"nginx + nchan are needed and `make bench-packages` did not install "
                    f"them ({e}); exit {r.returncode}:\n{r.stdout}{r.stderr}")


def our_nginx_processes() -> list[str]:
    """Command lines of nginx processes started from the benchmark's temp prefixes."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "/bench-nchan-" in cmd and "nginx" in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def no_client_failures(counters: dict[str, int]) -> list[str]:
    return [k for k in counters if k.startswith(CLIENT_FAILURES)]


@pytest.mark.timeout(150)
def test_quick_side_by_side_with_nchan() -> None:
    ensure_nginx_nchan()
    stdout, path = run_quick_bench("--only", "nchan")
    assert "Side by side" in stdout and "Targets" in stdout
    record = json.loads(path.read_text())
    res: dict[str, Any] = record["results"]["nchan"]
    assert "error" not in res, res["error"]
    n, publishes = res["subscribers"], res["publishes"]

    for key in KEYS:
        fan = res["fanout"][key]
        assert fan["opened"] == n
        assert fan["delivered_pct"] == 100.0 and fan["deliveries"] == n * publishes
        assert not no_client_failures(fan["client_counters_end"]), fan["client_counters_end"]
        for figure in ("last_p50_s", "last_p99_s", "all_p50_s", "all_p99_s"):
            assert fan[figure] > 0, (key, figure)
        assert fan["server_cpu_s_per_10k_deliveries"] >= 0
        assert fan["usage_all_publishes"]["server_cpu_s"] >= 0

        pub = res["publish"][key]
        assert pub["median_per_second"] > 0 and pub["median_per_server_cpu_second"] > 0
        for sample in pub["samples"]:
            assert sample["ok"] > 0
            # the server's count (summed over --workers) is the clients' count
            assert sample["stats_published_delta"] == sample["ok"], (key, sample)
            assert not no_client_failures(sample["client_counters"]), sample["client_counters"]

    for key in ("pushup-1", "nchan"):
        mem = res["memory"][key]
        assert mem["median_bytes_per_poll"] > 0
        assert all(s["opened"] == n for s in mem["samples"])

    side = record["side_by_side"]
    for row in side["figures"]:
        if row["unit"] == "note":
            continue
        wanted = ["pushup-1", "nchan"] if row["figure"].startswith("RSS") else KEYS
        assert all(row["values"][k] is not None for k in wanted), row
        assert row["ratios"]["PushUp / nchan"] is not None, row
    assert all(t["verdict"] != "no figure" for t in side["targets"]), side["targets"]
    assert not our_nginx_processes()  # every nginx it started was stopped
