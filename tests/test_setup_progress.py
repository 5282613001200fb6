"""deploy/setup_progress.py: `make run`'s quiet first install says, while it runs, which
phase it is in (read from the processes it started) and, at the end, how long it took;
its exit status is the step's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.toolkit import ROOT

PROGRESS = [sys.executable, str(ROOT / "deploy" / "setup_progress.py")]


def test_a_step_that_compiles_is_said_to_be_compiling_while_it_runs(tmp_path: Path):
    compiler = tmp_path / "cc"  # a process named as the C compiler is, for 1 s
    compiler.symlink_to("/bin/sleep")
    done = subprocess.run([*PROGRESS, "--every", "0.2", "--", "sh", "-c", f"{compiler} 1"],
                          capture_output=True, text=True, timeout=30)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert any(line.endswith("s: the C compiler is compiling the core (mypyc's C)...")
               for line in lines[:-1]), lines
    assert lines[-1].startswith("pushup: done in ") and lines[-1].endswith(" s")


def test_a_quiet_step_is_said_to_be_installing_and_a_failure_keeps_its_status():
    done = subprocess.run([*PROGRESS, "--every", "0.2", "--", "sh", "-c", "sleep 1; exit 3"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 3
    lines = done.stdout.splitlines()
    assert any(re.fullmatch(r"pushup: \d+ s: pip is downloading and installing the Python "
                            r"packages\.\.\.", line) for line in lines), lines
    assert lines[-1].startswith("pushup: failed (exit 3) after ")


def test_make_run_runs_its_install_under_it():
    made = subprocess.run(["make", "--no-print-directory", "--dry-run", "--always-make", "run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    assert any(line.startswith("python3 deploy/setup_progress.py --every 20 -- .venv/bin/python "
                               "-m pip install -q") for line in made.stdout.splitlines())
