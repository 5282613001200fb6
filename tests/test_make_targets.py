"""`make cluster` and `make demo` set up only what running a cluster needs: the run
install, HAProxy, and redis-server for ENGINE=redis; not the test suite's
packages or tools. `make run` says in one line what each setup step does, and
once set up runs only the node (read from `make --dry-run`, which runs nothing)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_ONLY = ("[test", "chromium", "nodejs", "npm", "nftables", "strace", "nginx")


def dry_run(*args: str) -> str:
    make = shutil.which("make")
    assert make, "make is needed"
    # --no-print-directory: under `make test` the inherited MAKELEVEL would add
    # "Entering directory" lines to what is read here.
    r = subprocess.run([make, "--no-print-directory", "--dry-run", "--always-make", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("target", ["cluster", "demo"])
def test_cluster_and_demo_install_only_what_a_cluster_needs(target):
    plain = dry_run(target)
    assert "pip install" in plain and "-e ." in plain  # the run install (--always-make)
    assert "haproxy" in plain and "redis-server" not in plain
    assert not [word for word in TEST_ONLY if word in plain], plain
    redis = dry_run(target, "ENGINE=redis")
    assert "redis-server" in redis
    assert not [word for word in TEST_ONLY if word in redis], redis


def test_make_run_says_each_setup_step_once_and_nothing_once_set_up():
    fresh = dry_run("run")  # --always-make: every setup step, each with its line
    steps = [line for line in fresh.splitlines() if line.startswith("echo \"pushup: ")]
    assert steps == [
        'echo "pushup: installing Python packages into .venv/ and compiling the core with '
        'mypyc where a C compiler exists (first run only, 1 to 3 minutes)..."',
        'echo "pushup: compiling the core with mypyc again (a compiled source changed; '
        'about a minute)..."'], fresh
    assert 'echo "pushup: creating the virtual environment .venv/ (first run only)"' in fresh
    # Set up (the install and the build both current): only the node starts.
    make = shutil.which("make")
    assert make
    ready = subprocess.run([make, "--no-print-directory", "--dry-run", "-o", ".venv/.installed-run",
                            "-o", "build/.compiled", "run"], cwd=ROOT, capture_output=True,
                           text=True, timeout=30)
    assert ready.returncode == 0, ready.stderr
    assert ready.stdout.splitlines() == [".venv/bin/pushup serve"], ready.stdout
