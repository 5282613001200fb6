"""Run ``python -m loadtest.bench --quick`` in a subprocess, as the bench tests do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_quick_bench(*args: str, timeout: float = 120) -> tuple[str, Path]:
    """The run's stdout and the path of the JSON record it wrote (``bench-<stamp>``);
    fails the test when it exits non-zero (or runs past ``timeout`` seconds)."""
    r = subprocess.run([sys.executable, "-m", "loadtest.bench", "--quick", *args],
                       cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stdout + r.stderr
    written = [line for line in r.stdout.splitlines() if line.startswith("written: ")]
    return r.stdout, ROOT / written[-1].split(" ", 1)[1]
