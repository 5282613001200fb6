"""What a quiet setup step is doing, said while it runs: `make run`'s first install
(``pip install -q -e .``, 1 to 3 minutes) runs under this, which prints one line
every ``--every`` seconds naming the phase the install is in, read from the
processes it started, and one line with the time it took at the end.

The phases, from the commands among the step's descendants (Linux /proc): pip
installing the build's own packages (mypy, Twisted...) in its isolated build
environment; mypyc translating the core to C (the build backend running setup.py);
the C compiler compiling that C; else pip downloading and installing packages.
The step's exit status is this one's. Standard library only: it runs before the
virtual environment exists.

    python3 deploy/setup_progress.py --every 20 -- .venv/bin/python -m pip install -q -e .
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from processes import process_tree  # deploy/processes.py: this runs as a script, from deploy/

COMPILERS = {"cc", "gcc", "cc1", "as", "ld", "collect2", "x86_64-linux-gnu-gcc",
             "x86_64-linux-gnu-gcc-12", "gcc-12", "clang"}
PHASES = (  # (how to tell, what to say), the first that holds
    ("compiler", "the C compiler is compiling the core (mypyc's C)"),
    ("backend", "mypyc is translating the core to C (setup.py, in pip's build)"),
    ("build-env", "pip is installing the build's packages (mypy, Twisted, ...) "
                  "in its build environment"),
    ("", "pip is downloading and installing the Python packages"),
)


def descendants(pid: int) -> list[tuple[str, str]]:
    """(command name, command line) of every process below ``pid``."""
    parents = process_tree()
    found, todo = [], list(parents.get(pid, []))
    while todo:
        child = todo.pop()
        todo += parents.get(child, [])
        try:
            comm = Path(f"/proc/{child}/comm").read_text().strip()
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        found.append((comm, cmdline))
    return found


def phase(processes: Sequence[tuple[str, str]]) -> str:
    """What the step is doing, said as PHASES says it."""
    signs = set()
    for comm, cmdline in processes:
        if comm in COMPILERS:
            signs.add("compiler")
        if "_in_process" in cmdline:
            signs.add("backend")
        if "pip-build-env" in cmdline and " install " in cmdline:
            signs.add("build-env")
    return next(text for sign, text in PHASES if not sign or sign in signs)


def run(command: Sequence[str], every: float, label: str) -> int:
    began = time.monotonic()
    step = subprocess.Popen(list(command))
    while True:
        try:
            status = step.wait(timeout=every)
            break
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - began
            print(f"{label}: {elapsed:.0f} s: {phase(descendants(step.pid))}...", flush=True)
        except KeyboardInterrupt:  # the terminal's Ctrl-C reached the step too
            status = step.wait()
            break
    print(f"{label}: done in {time.monotonic() - began:.0f} s" if status == 0
          else f"{label}: failed (exit {status}) after {time.monotonic() - began:.0f} s",
          flush=True)
    return status


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=20.0, help="seconds between lines")
    parser.add_argument("--label", default="pushup", help="what each line starts with")
    parser.add_argument("command", nargs="+", help="the step, after --")
    args = parser.parse_args(argv)
    return run(args.command, args.every, args.label)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
