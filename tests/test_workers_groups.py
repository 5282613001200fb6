"""`make test` runs on two pytest-xdist workers (--dist loadgroup): the tests that
use the whole machine (tests/conftest.py MACHINE) go to one worker, one after
another. These check that the grouping really happens with the pytest and xdist
installed (pytest 9 silently ignored it) and that MACHINE names real tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pushup
from tests.conftest import MACHINE

ROOT = Path(pushup.__file__).resolve().parent.parent

GROUPED = """
import os, pytest
@pytest.mark.xdist_group("machine")
@pytest.mark.parametrize("n", range(6))
def test_grouped(n):
    with open(os.environ["WORKERS_SEEN"], "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
@pytest.mark.parametrize("n", range(6))
def test_free(n):
    pass
"""


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    for name in ("test_one.py", "test_two.py"):
        (tmp_path / name).write_text(GROUPED)
    seen = tmp_path / "seen"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env={"WORKERS_SEEN": str(seen), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    workers = seen.read_text().split()
    assert len(workers) == 12
    assert len(set(workers)) == 1, workers


def test_the_machine_group_names_existing_tests() -> None:
    for prefix in MACHINE:
        assert (ROOT / prefix).exists(), prefix
