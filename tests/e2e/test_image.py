"""The container image (deploy/Containerfile) and the compose cluster (deploy/compose.yml),
with real podman (runc, deploy/containers.conf) and podman-compose from PyPI.

`make image`'s build (deploy/image.py: the Debian base images where none exists, then
the image) runs first; its base images stay in podman's store between runs, and the
build's layers too, so only a changed source compiles again (about a minute of mypyc).
Then: the node in the image runs as its own unprivileged user, answers its health
check, keeps its data volume across containers, and `podman stop` (SIGTERM) drains
it (a held poll is answered) to exit 0; and the cluster that `podman-compose up`
starts (3 nodes on Redis behind HAProxy) loses nothing it acknowledged while a node
is killed under publishers and long-polling followers at the front, the killed node
recreated as a rolling upgrade does it serves what the others took, and a node
stopped exits 0.

Every container is found by its id (or its compose project's label, a name of this
run's own) and removed by id at the end. The podman tests are one `image` group
(tests/ops/test_systemd_unit.py's too): one worker builds the image, once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.image import (
    COMPOSE_HAPROXY,
    TAG,
    TEST_BASES,
    build,
    compose_haproxy_config,
    podman_env,
)
from tests.cluster.clients import (
    Poller,
    check_exactly_once,
    jrequest,
    polling,
    uniq,
    wait_clients_have,
)
from tests.toolkit import ROOT, free_port, wait_until

COMPOSE = ROOT / "deploy" / "compose.yml"
NODE_UID = 10001  # the image's user (deploy/Containerfile)

needs_podman = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("podman") is None,
    reason="needs root and podman (make system-packages installs it)")


def podman(*args: str, check: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(["podman", *args], env=podman_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert not check or done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout.strip()


def logs(container: str) -> str:
    """What the container wrote, stdout and stderr."""
    done = subprocess.run(["podman", "logs", container], env=podman_env(), capture_output=True,
                          text=True, timeout=60)
    return done.stdout + done.stderr


def inspect(container: str, field: str) -> str:
    return podman("inspect", "--format", "{{" + field + "}}", container)


def healthy(base: str) -> bool:
    with urllib.request.urlopen(base + "/health", timeout=5) as answer:
        return answer.status == 200


def test_the_compose_haproxy_configuration_is_the_template_filled_in():
    """deploy/compose-haproxy.cfg is haproxy.cfg.template as deploy/launch.py fills it;
    after a change of the template: python3 deploy/image.py haproxy-cfg."""
    assert COMPOSE_HAPROXY.read_text() == compose_haproxy_config()


@pytest.fixture(scope="module")
def image() -> str:
    """localhost/pushup:latest, built as `make image` builds it (a cached build: seconds)."""
    began = time.monotonic()
    build(quiet=True, also=TEST_BASES)
    print(f"\nimage built in {time.monotonic() - began:.0f} s")
    return TAG


@needs_podman
@pytest.mark.xdist_group("image")
@pytest.mark.timeout(900)
def test_the_image_runs_unprivileged_keeps_its_volume_and_drains_to_exit_0(image, tmp_path):
    port = free_port()
    volume = f"pushup-test-{uuid.uuid4().hex[:10]}"
    podman("volume", "create", volume)
    started: list[str] = []
    base = f"http://127.0.0.1:{port}"

    def run_node() -> str:
        container = podman("run", "-d", "-e", f"PUSHUP_PORT={port}", "-e",
                           "PUSHUP_HOST=127.0.0.1", "-v", f"{volume}:/var/lib/pushup", image)
        started.append(container)
        wait_until(lambda: healthy(base), timeout=60, msg="the node in the image is healthy")
        return container

    try:
        first = run_node()
        # its own unprivileged user, as the host's kernel sees the node's process
        status = Path(f"/proc/{inspect(first, '.State.Pid')}/status").read_text()
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        assert uid_line.split()[1:] == [str(NODE_UID)] * 4
        # the image's HEALTHCHECK, run as podman runs it
        podman("healthcheck", "run", first)
        channel = uniq()
        status_code, sent = jrequest("POST", base + "/publish",
                                     {"channels": [channel], "data": "kept"})
        assert status_code == 201, sent
        # a poll held when podman stops the container is answered, not cut
        held: list[tuple[int, dict]] = []
        poll = threading.Thread(target=lambda: held.append(jrequest(
            "GET", f"{base}/subscribe?channels={uniq()}&timeout=60", timeout=90)))
        poll.start()
        wait_until(lambda: jrequest("GET", base + "/stats")[1]["waiting"] == 1,
                   msg="the poll is held")
        podman("stop", "--time", "10", first)
        poll.join(30)
        assert held and held[0][0] == 200 and held[0][1]["messages"] == [], held
        assert inspect(first, ".State.ExitCode") == "0"
        assert "[pushup.ops.node#info] drained" in logs(first)
        second = run_node()  # a new container on the same volume
        status_code, body = jrequest("GET", f"{base}/subscribe?channels={channel}&since=0"
                                            "&timeout=0")
        assert status_code == 200 and [m["id"] for m in body["messages"]] == [sent["id"]]
        podman("stop", "--time", "10", second)
        assert inspect(second, ".State.ExitCode") == "0"
    finally:
        for container in started:
            podman("rm", "-f", "-v", container, check=False)
        podman("volume", "rm", "-f", volume, check=False)


class Cluster:
    """deploy/compose.yml up under a compose project of this test's own, on free ports."""

    def __init__(self, image: str) -> None:
        self.project = f"pushup-test-{uuid.uuid4().hex[:10]}"
        self.token = uuid.uuid4().hex
        self.ports = {name: free_port() for name in
                      ("REDIS", "NODE1", "NODE2", "NODE3", "FRONT")}
        self.env = {**podman_env(), "PUSHUP_IMAGE": image, "PUSHUP_PUBLISH_TOKEN": self.token,
                    **{f"PUSHUP_{name}_PORT": str(port) for name, port in self.ports.items()}}
        self.front = f"http://127.0.0.1:{self.ports['FRONT']}"
        self.nodes = [f"http://127.0.0.1:{self.ports[f'NODE{i}']}" for i in (1, 2, 3)]

    def compose(self, *args: str) -> None:
        done = subprocess.run([sys.executable, "-m", "podman_compose", "-p", self.project,
                               "-f", str(COMPOSE), *args], env=self.env, capture_output=True,
                              text=True, timeout=180)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])

    def container(self, service: str) -> str:
        """The id of ``service``'s container."""
        return podman("ps", "-a", "-q", "--no-trunc",
                      "--filter", f"label=io.podman.compose.project={self.project}",
                      "--filter", f"label=io.podman.compose.service={service}")

    def containers(self) -> list[str]:
        return podman("ps", "-a", "-q", "--no-trunc", "--filter",
                      f"label=io.podman.compose.project={self.project}").split()

    def remove(self) -> None:
        try:
            if self.containers():
                self.compose("down")  # each node drains
        finally:
            for container in self.containers():  # whatever `down` left
                podman("rm", "-f", "-v", container, check=False)


@pytest.fixture
def cluster(image) -> Iterator[Cluster]:
    cluster = Cluster(image)
    try:
        cluster.compose("up", "-d")
        for base in (*cluster.nodes, cluster.front):
            wait_until(lambda base=base: healthy(base), timeout=60, msg=f"{base} is healthy")
        yield cluster
    finally:
        cluster.remove()


class Publisher(threading.Thread):
    """Publishes ``count`` messages through the front with the token, each with its own
    Idempotency-Key, resent with that key until it is acknowledged (201): a publish
    that reached a node killed before it answered is stored once, or not at all."""

    def __init__(self, front: str, token: str, channels: list[str], count: int) -> None:
        super().__init__(daemon=True)
        self.front, self.token, self.channels, self.count = front, token, channels, count
        self.published: dict[str, set[str]] = {}
        self.retries = 0
        self.errors: list[str] = []
        self.acknowledged = threading.Semaphore(0)

    def run(self) -> None:
        for n in range(self.count):
            channels = [self.channels[n % len(self.channels)]]
            headers = {"Authorization": f"Bearer {self.token}",
                       "Idempotency-Key": uuid.uuid4().hex}
            for _attempt in range(100):
                try:
                    status, body = jrequest("POST", self.front + "/publish",
                                            {"channels": channels, "data": n}, headers)
                except OSError as e:
                    status, body = 0, {"error": repr(e)}
                if status == 201:
                    break
                self.retries += 1
                time.sleep(0.1)
            else:
                self.errors.append(f"publish {n} never acknowledged: {status} {body}")
                return
            assert body["id"] not in self.published, body
            self.published[body["id"]] = set(channels)
            self.acknowledged.release()


@needs_podman
@pytest.mark.xdist_group("image")
@pytest.mark.timeout(900)
def test_the_compose_cluster_loses_nothing_acknowledged_when_a_node_is_killed(cluster):
    channels = [uniq() for _ in range(3)]
    unauthorised, _ = jrequest("POST", cluster.front + "/publish",
                               {"channels": channels, "data": "no token"})
    assert unauthorised == 401
    followers = [Poller(f"follower{i}", [cluster.front], [channel], timeout=2.0, limit=10)
                 for i, channel in enumerate(channels)]
    publisher = Publisher(cluster.front, cluster.token, channels, count=90)
    with polling(followers, may_fail=True):
        publisher.start()
        for _ in range(30):  # a third acknowledged, then node2 is killed (SIGKILL)
            assert publisher.acknowledged.acquire(timeout=60), publisher.errors
        podman("kill", cluster.container("node2"))
        publisher.join(120)
        assert not publisher.is_alive() and not publisher.errors, publisher.errors
        assert wait_clients_have(followers, publisher.published, timeout=60)
    check_exactly_once(followers, publisher.published)
    print(f"\n{len(publisher.published)} acknowledged, {publisher.retries} resent, "
          f"all followed once through the front")
    # node2 recreated as a rolling upgrade does it (docs/operations.md), the front
    # left alone: it serves what the others acknowledged, from Redis.
    front = cluster.container("haproxy")
    cluster.compose("up", "-d", "--no-deps", "--force-recreate", "node2")
    wait_until(lambda: healthy(cluster.nodes[1]), timeout=60, msg="node2 is back")
    assert cluster.container("haproxy") == front
    status, body = jrequest("GET", f"{cluster.nodes[1]}/subscribe?channels={channels[0]}"
                                   "&since=0&timeout=0&limit=1000")
    assert status == 200
    assert sorted(m["id"] for m in body["messages"]) == sorted(
        mid for mid, chans in publisher.published.items() if channels[0] in chans)
    # A node stopped drains and exits 0.
    node3 = cluster.container("node3")
    podman("stop", "--time", "10", node3)
    assert inspect(node3, ".State.ExitCode") == "0"
    assert "[pushup.ops.node#info] drained" in logs(node3)
