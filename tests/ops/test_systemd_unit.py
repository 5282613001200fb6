"""deploy/pushup.service: ``systemd-analyze verify`` finds nothing to say about
it, and its command line, run as docs/operations.md's install steps set it up, serves
and drains well within the unit's stop timeout; a configuration error exits 2,
which the unit does not restart. Its sandbox scores under 3 with ``systemd-analyze
security``, and the node serves in it under a real systemd: this machine runs none,
so a container of Debian 12 boots one (podman), with the node's environment taken
from the container image (deploy/image.py), and the unit runs there as installed.

The podman test shares the `image` group with tests/e2e/test_image.py: one worker
builds the image, once."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from deploy.image import TEST_BASES, build, podman_env, systemd_base
from pushup.ops.node import DRAIN_LIMIT
from tests.toolkit import ROOT, clean_env, free_port, wait_until

UNIT = ROOT / "deploy" / "pushup.service"


def settings() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def test_systemd_analyze_verify_accepts_the_unit_without_a_warning(tmp_path):
    """In a root of our own: the system's unit directory (the targets the unit
    names), the unit where docs/operations.md installs it, and an executable where
    ExecStart expects pushup (verify checks that it exists)."""
    root = tmp_path / "root"
    (root / "usr/lib/systemd").mkdir(parents=True)
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "lib").symlink_to("usr/lib")
    executable = Path(shlex.split(settings()["ExecStart"][0])[0])
    stub = root / executable.relative_to("/")
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    unit = root / "etc/systemd/system/pushup.service"
    unit.parent.mkdir(parents=True)
    shutil.copy(UNIT, unit)
    result = subprocess.run(["systemd-analyze", "verify", f"--root={root}", str(unit)],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr, result.stdout) == (0, "", "")


def test_systemd_analyze_security_rates_the_sandbox_below_3():
    """The exposure systemd-analyze scores, from 0 (locked down) to 10: the unit
    without its sandbox scored 8.3, EXPOSED (--threshold counts tenths: 29 is 2.9)."""
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=29",
                             str(UNIT)], capture_output=True, text=True, timeout=60)
    overall = result.stdout.strip().splitlines()[-1]
    assert result.returncode == 0, overall
    assert float(overall.split("pushup.service: ")[1].split()[0]) < 3


def test_the_unit_keeps_state_restarts_on_failure_and_outwaits_the_drain():
    unit = settings()
    assert unit["StateDirectory"] == ["pushup"] and unit["Restart"] == ["on-failure"]
    assert float(unit["TimeoutStopSec"][0]) >= DRAIN_LIMIT + 1  # the README's 5 s, and more


def test_a_configuration_error_exits_2_which_the_unit_does_not_restart(tmp_path):
    assert settings()["RestartPreventExitStatus"] == ["2"]
    config = tmp_path / "node.toml"
    config.write_text('port = 8080\nmax_timout = 30\n')  # a typo'd setting
    result = subprocess.run([sys.executable, "-m", "pushup", "serve", "--config", str(config)],
                            capture_output=True, text=True, env=clean_env(), cwd=ROOT,
                            timeout=60)
    assert result.returncode == 2
    assert result.stderr == (f"pushup: error: config file {config}: unknown setting "
                             "'max_timout' (did you mean 'max_timeout'?)\n")


def test_its_command_line_serves_keeps_its_data_dir_and_drains_in_time(tmp_path, serve):
    """ExecStart's arguments with the config file the README tells to write
    for a single node (data_dir in the unit's StateDirectory, here tmp_path)."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    port = free_port()
    config = tmp_path / "node.toml"
    config.write_text(f'port = {port}\nnode_id = "node1"\ndata_dir = "{state}"\n')
    argv = shlex.split(settings()["ExecStart"][0])
    assert argv[1:] == ["serve", "--config", "/etc/pushup/node.toml"]
    node = serve("--config", str(config), port=port)
    assert node.listening == f"listening on http://127.0.0.1:{port}"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
        assert r.status == 200
    assert any(state.iterdir())  # the cache lives in the state directory
    began = time.monotonic()
    assert node.stop(timeout=float(settings()["TimeoutStopSec"][0])) == 0  # not a failure
    print(f"\ndrained and exited {time.monotonic() - began:.2f} s after SIGTERM")


def _in(container: str, *command: str) -> str:
    done = subprocess.run(["podman", "exec", container, *command], env=podman_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return done.stdout.strip()


def _health(base: str) -> bool:
    with urllib.request.urlopen(base + "/health", timeout=5) as answer:
        return answer.status == 200


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("podman") is None,
                    reason="needs root and podman (make system-packages installs it)")
@pytest.mark.xdist_group("image")
@pytest.mark.timeout(900)
def test_the_node_serves_and_drains_in_the_units_sandbox_under_systemd(tmp_path):
    image, base = build(quiet=True, also=TEST_BASES), systemd_base()
    port = free_port()
    config = tmp_path / "node.toml"
    config.write_text(f'port = {port}\nnode_id = "node1"\ndata_dir = "/var/lib/pushup"\n')
    url = f"http://127.0.0.1:{port}"
    container = subprocess.run(
        ["podman", "run", "-d", "--systemd=always",
         "--mount", f"type=image,source={image},destination=/image",
         "-v", f"{config}:/etc/pushup/node.toml:ro",
         "-v", f"{UNIT}:/etc/systemd/system/pushup.service:ro", base, "/lib/systemd/systemd"],
        env=podman_env(), capture_output=True, text=True, timeout=120, check=True,
    ).stdout.strip()
    try:
        # the install steps' /opt/pushup/venv: the image's environment (its scripts
        # name /opt/pushup/bin/python)
        _in(container, "sh", "-c", "mkdir -p /opt/pushup && ln -s /image/opt/pushup/* "
            "/opt/pushup/ && ln -s /opt/pushup /opt/pushup/venv")
        wait_until(lambda: subprocess.run(
            ["podman", "exec", container, "systemctl", "is-system-running"], env=podman_env(),
            capture_output=True, text=True).stdout.strip() in ("running", "degraded"),
            timeout=60, msg="systemd has booted")
        _in(container, "systemctl", "start", "pushup")
        wait_until(lambda: _health(url), timeout=60, msg="the unit's node is healthy")
        pid = _in(container, "systemctl", "show", "-p", "MainPID", "--value", "pushup")
        status = dict(line.split(":\t", 1) for line in _in(
            container, "cat", f"/proc/{pid}/status").splitlines() if ":\t" in line)
        # the sandbox is in force: no capability, no new privileges, a seccomp filter
        assert (status["CapEff"], status["CapBnd"], status["NoNewPrivs"], status["Seccomp"]) \
            == ("0000000000000000", "0000000000000000", "1", "2")
        with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
            assert b"\nprocess_resident_memory_bytes " in answer.read()
        request = urllib.request.Request(url + "/publish", method="POST", data=json.dumps(
            {"channels": ["kept"], "data": 1}).encode(), headers={"Content-Type":
                                                                  "application/json"})
        with urllib.request.urlopen(request, timeout=5) as answer:
            sent = json.load(answer)
        _in(container, "systemctl", "stop", "pushup")
        stopped = _in(container, "systemctl", "show", "-p", "Result", "-p", "ExecMainStatus",
                      "pushup")
        assert sorted(stopped.splitlines()) == ["ExecMainStatus=0", "Result=success"]
        assert "[pushup.ops.node#info] drained" in _in(
            container, "journalctl", "-u", "pushup", "--no-pager")
        # its StateDirectory keeps the cache for the next start
        _in(container, "systemctl", "start", "pushup")
        wait_until(lambda: _health(url), timeout=60, msg="the unit's node is healthy again")
        with urllib.request.urlopen(f"{url}/subscribe?channels=kept&since=0&timeout=0",
                                    timeout=5) as answer:
            assert [m["id"] for m in json.load(answer)["messages"]] == [sent["id"]]
        _in(container, "systemctl", "stop", "pushup")
    finally:
        subprocess.run(["podman", "rm", "-f", "-v", container], env=podman_env(),
                       capture_output=True, timeout=120)
