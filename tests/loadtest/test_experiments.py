"""The seed experiments at tiny scale, for real: servers, the rate load, a veth, the figures.

Each experiment runs ``python -m loadtest.experiments --profile smoke`` in a
subprocess and the test checks that every figure is present and sane (never
how fast: the machine is shared). The namespace experiment needs root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtest.experiments import netns
from loadtest.experiments.reactors import PLANS, parse_strace

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
@pytest.fixture
def needs_root() -> None:
    """Network namespaces need root, ip and tc (`make test` installs iproute2; CI is root)."""
    if os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("tc")):
        pytest.fail("the namespace experiment needs root, ip and tc")


def run_smoke(only: str, out: Path) -> list[dict[str, Any]]:
    r = subprocess.run(
        [sys.executable, "-m", "loadtest.experiments", "--profile", "smoke", "--only", only,
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ETA" in r.stdout  # progress is shown while it runs
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG, path


@pytest.mark.timeout(110)
def test_reactor_experiment_measures_every_reactor_at_every_idle_count(tmp_path: Path) -> None:
    rows = run_smoke("reactors", tmp_path)
    plan = PLANS["smoke"]
    points = [r for r in rows if r["experiment"] == "reactors"]
    for reactor, ns in plan.idle.items():
        for n in ns:
            for kind in plan.workloads:
                got = [r for r in points if (r["reactor"], r["idle"], r["kind"]) ==
                       (reactor, n, kind) and r["offered_rate"] == plan.fixed_rate]
                assert len(got) == 1, (reactor, n, kind)
    for r in points:
        assert r["held"] >= r["idle"]  # the idle polls were really held meanwhile
        assert r["replies"] > 0 and r["reply_rate"] > 0
        assert r["replies"] + r["errors"] + r["unsent"] + r["unanswered"] == r["offered"]
        assert r["reply_rate"] <= r["offered_rate"] * 1.5
        assert 0 < r["latency_p50_ms"] <= r["latency_p99_ms"]
        assert r["server_cpu_us_per_reply"] is None or r["server_cpu_us_per_reply"] >= 0
        assert r["generator_cpu_pct"] >= 0 and r["others_cpu_pct"] >= 0
    traces = {r["reactor"]: r["syscalls"] for r in rows if r["experiment"] == "strace"}
    for name in ("fig1-reply-vs-offered", "fig2-reply-vs-idle"):
        assert_png(tmp_path / f"{name}.png")
    if not shutil.which("strace"):
        return  # the run says so and carries on without system-call counts
    assert traces["epoll"].get("epoll_wait", 0) > 0
    assert traces["poll"].get("poll", 0) > 0
    assert traces["select"].get("select", 0) + traces["select"].get("pselect6", 0) > 0
    assert_png(tmp_path / "fig3-syscalls.png")


@pytest.mark.timeout(110)
def test_wan_experiment_counts_more_packets_at_a_smaller_mtu_and_tears_down(
        tmp_path: Path, needs_root: None) -> None:
    rows = run_smoke("wan", tmp_path)
    points = [r for r in rows if r["experiment"] == "wan"]
    assert points
    for r in points:
        assert r["deliveries"] == r["subscribers"] * r["rounds"]
        assert r["packets_per_delivery"] >= 2  # an answer and its re-poll, at least
        assert r["tx_bytes_per_delivery"] >= r["size"]
        assert r["server_cpu_us_per_delivery"] >= 0 and r["generator_cpu_pct"] >= 0
        assert 0 < r["trip_p50_ms"] <= r["trip_last_ms"]
        assert r["qdisc_drops"] >= 0 and r["retrans_segments"] >= 0
    big = {r["mtu"]: r for r in points if r["series"] == "mtu" and r["size"] == 2048}
    assert big[296]["tx_packets_per_delivery"] > big[1500]["tx_packets_per_delivery"]
    assert {r["cap"] for r in points if r["series"] == "cap"} == {"none", "10mbit"}
    for name in ("fig4-wan-cpu-packets-vs-mtu", "fig5-wan-trip-vs-mtu",
                 "fig6-wan-vs-bandwidth"):
        assert_png(tmp_path / f"{name}.png")
    assert not os.path.exists(netns.NETNS_PATH)
    assert not os.path.exists(f"/sys/class/net/{netns.SERVER_IF}")


def test_setup_removes_the_leftovers_of_an_earlier_run(needs_root: None) -> None:
    try:
        netns.setup()
        netns.setup()  # the names are taken: this works only if it clears them first
        assert os.path.exists(netns.NETNS_PATH)
    finally:
        netns.teardown()
    assert not os.path.exists(netns.NETNS_PATH)
    assert not os.path.exists(f"/sys/class/net/{netns.SERVER_IF}")


def test_strace_summary_is_read_into_calls_per_syscall() -> None:
    table = """% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 52.10    0.010000           5      2000           epoll_wait
 30.00    0.005000           2      2100       100 recvfrom
  0.50    0.000100           1        12           epoll_ctl
------ ----------- ----------- --------- --------- ----------------
100.00    0.015100                  4112       100 total
"""
    assert parse_strace(table) == {"epoll_wait": 2000, "recvfrom": 2100, "epoll_ctl": 12}
