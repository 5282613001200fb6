"""The Durable Streams conformance suite (npm ``@durable-streams/server-conformance-tests``,
pinned by tests/conformance/streams/package-lock.json) against one real `pushup serve`,
and (``make conformance-streams-cluster``) against 3 nodes behind HAProxy round robin:
on one redis-server, on a 3-primary Redis Cluster, and on the mesh.

The suite is the protocol authors' own (vitest, 338 tests: core, idempotent
producers, forks, subscriptions); it runs whole against ``CONFORMANCE_TEST_URL``
and this test fails on any test of it that fails, naming each. The 6 tests of
the protocol's reserved subscription APIs (§6-7, optional) run only when a
server declares them (``CONFORMANCE_SUBSCRIPTIONS=1``, which
durable-streams.test.mjs passes on as ``subscriptions: true``): PushUp serves
them on every engine, so every run declares them and every test runs. `make
npm-clients` installs the package (`make setup` does).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.launch import LocalCluster
from deploy.redis_cluster import RedisCluster
from tests.cluster.redis_backends import running_cluster
from tests.toolkit import ServedNode, wait_healthy

SUITE = Path(__file__).resolve().parent / "streams"
RUN_GUARD = 600.0  # the whole suite takes ~35-90 s; this only stops a hung run


def run_suite(url: str, subscriptions: bool = False) -> dict[str, object]:
    """Run the whole suite against ``url`` (with the subscription APIs'
    tests when ``subscriptions``); vitest's JSON report."""
    vitest = SUITE / "node_modules" / ".bin" / "vitest"
    assert vitest.exists(), "the suite is not installed: `make npm-clients` installs it"
    node = shutil.which("node")
    assert node is not None, "node is not installed: `make setup` installs nodejs"
    with tempfile.TemporaryDirectory(prefix="pushup-durable-streams-") as scratch:
        report = Path(scratch) / "report.json"
        done = subprocess.run(
            [node, str(vitest), "run", "durable-streams.test.mjs", "--reporter=json",
             f"--outputFile={report}"],
            cwd=SUITE, env={**os.environ, "CONFORMANCE_TEST_URL": url,
                            "CONFORMANCE_SUBSCRIPTIONS": "1" if subscriptions else "0"},
            stdin=subprocess.DEVNULL, capture_output=True, timeout=RUN_GUARD, check=False)
        assert report.exists(), f"vitest wrote no report:\n{done.stderr.decode()[-3000:]}"
        result: dict[str, object] = json.loads(report.read_text())
        return result


def outcomes(report: dict[str, object]) -> dict[str, collections.Counter[str]]:
    """Each top-level group of the suite: how many of its tests passed, failed, skipped."""
    groups: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for file in report["testResults"]:  # type: ignore[attr-defined]
        for test in file["assertionResults"]:
            group = test["ancestorTitles"][0] if test["ancestorTitles"] else ""
            groups[group][test["status"]] += 1
    return groups


def failures(report: dict[str, object]) -> list[str]:
    return [f"{test['fullName']}: {' '.join(test['failureMessages'])[:300]}"
            for file in report["testResults"]  # type: ignore[attr-defined]
            for test in file["assertionResults"] if test["status"] == "failed"]


@pytest.mark.timeout(RUN_GUARD + 60)
def test_the_durable_streams_suite_passes_whole_on_one_node() -> None:
    node = ServedNode("--host", "127.0.0.1")
    try:
        wait_healthy(node.url, time.monotonic() + 30, node.proc)
        report = run_suite(node.url, subscriptions=True)
    finally:
        assert node.stop() == 0, "the node exited non-zero after SIGTERM"
    groups = outcomes(report)
    for group, counts in sorted(groups.items()):
        print(f"{group}: {dict(counts)}")
    assert failures(report) == []
    assert report["numPassedTests"] == report["numTotalTests"]  # none skipped
    assert groups["Reserved subscription APIs"]["passed"] == 6


def suite_on_three_nodes(engine: str, subscriptions: bool = False) -> dict[str, object]:
    """The suite's report against 3 nodes on ``engine`` behind HAProxy round robin:
    each request of a test goes to another node than the last, so every stream is
    written, read and followed across nodes (and, with ``subscriptions``, every
    subscription made, acked and woken through them)."""
    cluster = LocalCluster(nodes=3, haproxy=True, engine=engine)
    try:
        cluster.start()
        report = run_suite(cluster.front_url, subscriptions)
    finally:
        cluster.stop()
    for group, counts in sorted(outcomes(report).items()):
        print(f"{group}: {dict(counts)}")
    return report


def assert_every_test_passed(report: dict[str, object]) -> None:
    """Every test of the suite passed, the 6 of the subscription APIs too."""
    assert failures(report) == []
    assert report["numPassedTests"] == report["numTotalTests"]  # none skipped
    assert outcomes(report)["Reserved subscription APIs"]["passed"] == 6


@pytest.mark.timeout(RUN_GUARD + 120)
def test_the_durable_streams_suite_passes_whole_on_three_nodes_on_redis_behind_haproxy(
        redis_server) -> None:
    """The subscriptions held by the node that took their lease in Redis."""
    assert_every_test_passed(suite_on_three_nodes(redis_server.url, subscriptions=True))


@pytest.fixture
def three_primaries() -> Iterator[RedisCluster]:
    """A Redis Cluster of 3 primaries, no replica, stopped by PID at the end."""
    yield from running_cluster(replicas=0)


@pytest.mark.timeout(RUN_GUARD + 180)
@pytest.mark.streams_redis_cluster  # ~70 s: `make conformance-streams-cluster` runs it
def test_the_durable_streams_suite_passes_whole_on_three_nodes_on_a_redis_cluster(
        three_primaries) -> None:
    """Forks and their sources over a Cluster's slots: each fork family in one
    slot (docs/api.md, "In a cluster on Redis"); the subscriptions' lease and
    state in their own slot, every primary scanned for a backfill."""
    assert_every_test_passed(suite_on_three_nodes(three_primaries.seeds, subscriptions=True))


@pytest.mark.timeout(RUN_GUARD + 120)
def test_the_durable_streams_suite_passes_whole_on_three_mesh_nodes_behind_haproxy() -> None:
    """Each stream is held by one node; the others hand its requests on. The
    subscriptions are held by one node, which the others tell their streams'
    news: the suite's 6 tests of them run too."""
    assert_every_test_passed(suite_on_three_nodes("mesh", subscriptions=True))
