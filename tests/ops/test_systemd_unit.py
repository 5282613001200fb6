"""deploy/pushup.service: ``systemd-analyze verify`` finds nothing to say about
it, and its command line, run as docs/operations.md's install steps set it up, serves
and drains well within the unit's stop timeout; a configuration error exits 2,
which the unit does not restart."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from pushup.ops.node import DRAIN_LIMIT
from tests.toolkit import ROOT, clean_env, free_port

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
