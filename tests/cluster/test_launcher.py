"""`make cluster` (deploy/launch.py) as a user runs it: real nodes, real HAProxy
(and a real redis-server for ENGINE=redis, a real Redis Cluster for
ENGINE=redis-cluster). A node SIGKILLed is reported, the
front keeps serving publishes and polls, the launcher keeps running (restarting
the node, or leaving it dead with --leave-dead); no secret is on a command line;
Ctrl-C stops everything with no traceback and nothing left in the temporary
directory; a busy front port is one line."""
from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from deploy.redis_server import command
from pushup.backplane.redis.partitions import keys_of
from tests.cluster.clients import jrequest, subscribe, wait_until
from tests.toolkit import children, free_port

ROOT = Path(__file__).resolve().parents[2]


class Launcher:
    """deploy/launch.py in a subprocess, its stdout read line by line."""

    COMMAND = ("deploy/launch.py",)  # after the interpreter

    def __init__(self, tmp: Path, *args: str) -> None:
        self.port = free_port()
        # the launcher's TMPDIR, which must be empty after it: short, as a Unix
        # socket's path in it must fit 107 bytes (pytest-xdist's tmp_path is long)
        self.tmpdir = Path(tempfile.mkdtemp(prefix="launch-"))
        env = {**os.environ, "TMPDIR": str(self.tmpdir)}
        env.pop("PUSHUP_CLUSTER_DIR", None)
        self.proc = subprocess.Popen(
            [sys.executable, *self.COMMAND, "--nodes", "3", "--port", str(self.port),
             "--logs", str(tmp / "logs"), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, cwd=ROOT, env=env)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            m = re.search(pattern, line)
            if m:
                return m
        raise AssertionError(f"no line matching {pattern!r}; saw {self.seen}; "
                             f"stderr: {self.stderr_now()}")

    def stderr_now(self) -> str:
        return "" if self.proc.poll() is None else (self.proc.stderr.read() if
                                                       self.proc.stderr else "")

    @property
    def front(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """After a failed test: Ctrl-C, and if that does not stop it, SIGKILL
        it and what it started (its nodes are in sessions of their own)."""
        if self.proc.poll() is None:
            started = children(self.proc.pid)
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                for pid in [*started, self.proc.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def publish(front: str, channel: str, data: object) -> dict:
    """Publish through the front until it answers 201, with one Idempotency-Key:
    a try HAProxy sent to the node just killed may have been stored."""
    key = uuid.uuid4().hex
    answers: list[object] = []

    def once() -> dict | None:
        status, body = jrequest("POST", front + "/publish", {"channels": [channel], "data": data},
                                headers={"Idempotency-Key": key})
        answers.append((status, body))
        return body if status == 201 else None

    return wait_until(once, 30, 0.1, f"a 201 through the front (answers: {answers[-3:]})")


@pytest.mark.parametrize("engine, leave_dead", [("mesh", False), ("redis", True)])
def test_a_killed_node_is_reported_and_the_front_keeps_serving(tmp_path, engine, leave_dead):
    launcher = Launcher(tmp_path, "--engine", engine, *(["--leave-dead"] if leave_dead else []))
    try:
        policy = "left dead" if leave_dead else "restarted"
        launcher.wait_line(f"a node that dies is reported and {policy}")
        launcher.wait_line(r"^Ctrl-C stops everything$")
        pids = {int(m.group(2)): m.group(1) for m in (
            re.search(r"^(node\d): .* \(pid (\d+)\)$", line) for line in launcher.seen) if m}
        assert sorted(pids.values()) == ["node1", "node2", "node3"], launcher.seen

        # no secret on any command line: every process the launcher started
        started = children(launcher.proc.pid)
        assert set(pids) <= set(started)
        assert len(started) == 3 + 1 + (engine == "redis")  # nodes, HAProxy, redis-server
        secret = environ(next(iter(pids)))["PUSHUP_CLUSTER_SECRET"]
        assert len(secret) >= 16
        for pid in started:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
            assert secret not in cmdline and "secret" not in cmdline, cmdline

        channel = f"launch-{uuid.uuid4().hex[:8]}"
        first = publish(launcher.front, channel, 1)
        node1 = next(pid for pid, name in pids.items() if name == "node1")
        os.kill(node1, signal.SIGKILL)
        second = publish(launcher.front, channel, 2)  # the front still takes publishes
        for _ in range(6):  # ...and polls, wherever HAProxy sends them
            status, body = subscribe(launcher.front, [channel], since="0")
            assert status == 200, body
            assert [(m["id"], m["data"]) for m in body["messages"]] == [
                (first["id"], 1), (second["id"], 2)]

        launcher.wait_line(rf"node1 \(pid {node1}, .*\) was killed by SIGKILL; "
                           + ("left dead" if leave_dead else "restarting it"))
        if not leave_dead:
            back = int(launcher.wait_line(r"node1 is back \(pid (\d+)\)").group(1))
            assert back != node1 and back in children(launcher.proc.pid)
        assert launcher.proc.poll() is None  # the launcher keeps running

        launcher.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert launcher.proc.wait(timeout=60) == 0
        err = launcher.proc.stderr.read()  # type: ignore[union-attr]
        assert "Traceback" not in err, err
        assert children(launcher.proc.pid) == []
        for pid in started:
            assert not Path(f"/proc/{pid}").exists(), pid
        assert list(launcher.tmpdir.iterdir()) == []  # no temporary directory left
        assert sorted(p.name for p in (tmp_path / "logs").glob("node*.log")) == [
            "node1.log", "node2.log", "node3.log"]
    finally:
        launcher.stop()


def test_a_busy_front_port_is_one_line_without_a_traceback(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "deploy/launch.py", "--port", str(port),
                            "--logs", str(tmp_path / "logs")], capture_output=True, text=True,
                           cwd=ROOT, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        f"launch: port {port} is already in use on 127.0.0.1 (another process listens "
        f"there): stop it, or choose another port: make cluster PORT={port + 1}"], r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_a_redis_cluster_of_its_own_fails_over_a_killed_primary_and_restarts_it(tmp_path):
    launcher = Launcher(tmp_path, "--engine", "redis-cluster")
    try:
        launcher.wait_line(r"^Ctrl-C stops everything$")
        redis = {int(m.group(1)): (m.group(2), int(m.group(3))) for m in (
            re.search(r"^redis 127\.0\.0\.1:(\d+): (primary|replica) \(pid (\d+)\)$", line)
            for line in launcher.seen) if m}
        assert sorted(role for role, _ in redis.values()) == ["primary"] * 3 + ["replica"] * 3
        engine = next(line for line in launcher.seen if line.startswith("engine: "))
        assert engine == "engine: redis://" + ",".join(f"127.0.0.1:{p}" for p in redis)
        started = children(launcher.proc.pid)
        assert {pid for _, pid in redis.values()} <= set(started)
        assert len(started) == 3 + 1 + 6  # nodes, HAProxy, Redis Cluster nodes

        channel = f"launch-{uuid.uuid4().hex[:8]}"
        first = publish(launcher.front, channel, 1)
        nodes = [m.group(1) for m in (re.search(r"^node\d: (\S+) \(pid \d+\)$", line)
                                      for line in launcher.seen) if m]
        seen = {}  # node -> the cursor after the first message
        for base in nodes:  # each node reads it a moment after the 201
            seen[base] = wait_until(lambda b=base: (lambda body: body["messages"] and body)(
                subscribe(b, [channel], since="0")[1]), 10, 0.05, "every node read it")
            assert [m["id"] for m in seen[base]["messages"]] == [first["id"]]
        some = next(iter(redis))
        slot = command(some, "CLUSTER", "KEYSLOT", keys_of(channel).log)
        primary = next(int(owner[1]) for start, end, owner, *_ in
                       command(some, "CLUSTER", "SLOTS") if start <= slot <= end)
        assert command(primary, "WAIT", 1, 5000) == 1  # its replica holds the first
        os.kill(redis[primary][1], signal.SIGKILL)
        second = publish(launcher.front, channel, 2)  # once the replica took over
        for base in nodes:
            wait_until(lambda b=base: subscribe(b, [channel], since=seen[b]["cursor"])[1][
                "messages"], 10, 0.05, "every node read the second")
            # The replica held the whole log: it goes on, nothing lost, no gap.
            status, body = subscribe(base, [channel], since=seen[base]["cursor"])
            assert [m["id"] for m in body["messages"]] == [second["id"]] and "gap" not in body
        for _ in range(6):  # ...and polls, wherever HAProxy sends them
            status, body = subscribe(launcher.front, [channel], since="0")
            assert status == 200, body
            assert [(m["id"], m["data"]) for m in body["messages"]] == [
                (first["id"], 1), (second["id"], 2)]
        launcher.wait_line(rf"\] redis 127\.0\.0\.1:{primary} \(pid {redis[primary][1]}\) was "
                           r"killed by SIGKILL; restarting it once its slots are served")
        back = int(launcher.wait_line(rf"redis 127\.0\.0\.1:{primary} is back \(pid (\d+)\)")
                   .group(1))
        assert command(primary, "PING") == b"PONG" and back in children(launcher.proc.pid)

        launcher.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert launcher.proc.wait(timeout=60) == 0
        err = launcher.proc.stderr.read()  # type: ignore[union-attr]
        assert "Traceback" not in err, err
        assert children(launcher.proc.pid) == []
        for pid in [*started, back]:
            assert not Path(f"/proc/{pid}").exists(), pid
        assert list(launcher.tmpdir.iterdir()) == []  # no temporary directory left
    finally:
        launcher.stop()


def test_a_node_port_taken_before_its_node_listens_is_picked_again() -> None:
    """A node's port is picked, then given to the node: another process may take
    it in between (on a busy machine, the port of an outgoing connection). The
    nodes then start on new ports, and name each other's right."""
    from deploy.launch import LocalCluster

    cluster = LocalCluster(nodes=2, haproxy=False)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", cluster.node_ports[1]))
    squatter.listen()
    try:
        cluster.start()
        assert squatter.getsockname()[1] not in cluster.node_ports
        for i in range(2):
            status, body = jrequest("GET", cluster.node_url(i) + "/stats")
            assert status == 200
            assert [p["url"] for p in body["peers"]] == [cluster.node_url(1 - i)]
    finally:
        cluster.stop()
        squatter.close()
