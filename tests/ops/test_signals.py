"""Ctrl-C on the launchers, as a terminal sends it: SIGINT to the whole process
group (the launcher and every node it started), at a moment the launcher is
still starting or once it serves. Everything stops, exit 0, no traceback in
the launcher's output or in any node's log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.toolkit import clean_env, free_port

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 30.0


def launch(argv: list[str], log: Path, **env: str) -> subprocess.Popen:
    """A launcher as a terminal starts it, in its own process group. Not the
    toolkit's ``ServedNode``: these tests stop it before it may print its
    listening line, and the cluster launcher is not ``pushup serve``."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=open(log, "wb"),
                            env=clean_env(env), cwd=ROOT, start_new_session=True)


def ctrl_c(proc: subprocess.Popen) -> int:
    os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(DEADLINE)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def test_ctrl_c_while_the_workers_supervisor_starts_its_workers(tmp_path):
    log = tmp_path / "stderr.log"
    proc = launch([sys.executable, "-m", "pushup", "serve", "--workers", "2",
                   "--port", str(free_port())], log)
    # A worker has started logging; the supervisor has not printed its own line
    # yet (it waits for every worker to be healthy).
    deadline = time.monotonic() + DEADLINE
    while not log.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    assert ctrl_c(proc) == 0
    text = log.read_text()
    assert "Traceback" not in text and "critical" not in text, text
    assert proc.stdout.read() == b""  # it never claimed to listen


def test_ctrl_c_on_make_cluster_stops_every_node_without_a_traceback(tmp_path):
    logs = tmp_path / "cluster"
    logs.mkdir()
    proc = launch([sys.executable, "deploy/launch.py", "--nodes", "2",
                   "--port", str(free_port())], tmp_path / "launcher.log",
                   PUSHUP_CLUSTER_DIR=str(logs))
    deadline = time.monotonic() + DEADLINE
    while not proc.stdout.readline().startswith(b"Ctrl-C stops"):  # the last line of its start
        assert time.monotonic() < deadline and proc.poll() is None
    assert ctrl_c(proc) == 0
    launcher = (tmp_path / "launcher.log").read_text()
    assert "Traceback" not in launcher, launcher
    for i in (1, 2):
        node = (logs / f"node{i}.log").read_text()
        assert "Traceback" not in node and "critical" not in node, node
        assert node.rstrip().endswith("drained"), node
