"""`python -m loadtest.experiments [--profile smoke|full] [--only reactors|wan]`.

Runs the seed experiments (see loadtest/experiments/__init__.py), appends one
JSON line per point to OUT/results.jsonl, prints progress with an ETA, and
draws the figures into OUT. Every server, load worker, strace and network
namespace it starts is stopped or removed before it exits, on failure too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

from . import figures, reactors, tables, wan
from .measure import Recorder

REPO = Path(__file__).resolve().parents[2]
TIME_LIMITS = {"smoke": 150, "full": 2400}


def _out_of_time(signum: int, frame: object) -> None:
    raise TimeoutError("the experiment ran out of its time limit")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.experiments")
    ap.add_argument("--profile", choices=("smoke", "full"), default="smoke")
    ap.add_argument("--only", choices=("reactors", "wan"), action="append")
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder (default loadtest/out/seeds-PROFILE)")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="seconds before the run is abandoned, cleaning up "
                         "(default 150 for smoke, 2400 for full)")
    args = ap.parse_args(argv)
    limit = args.time_limit or TIME_LIMITS[args.profile]
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.alarm(int(limit))  # every `finally` below still runs: servers, workers, netns
    out: Path = args.out or REPO / "loadtest" / "out" / f"seeds-{args.profile}"
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    if results.exists():
        results.unlink()
    which = args.only or ["reactors", "wan"]
    r_plan = reactors.PLANS[args.profile]
    w_plan = wan.PLANS[args.profile]
    total = (r_plan.points() if "reactors" in which else 0) + (
        w_plan.points() if "wan" in which else 0)
    rec = Recorder(results, total)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    rec.row({"experiment": "machine", "stamp": stamp, "profile": args.profile,
             "cpus": os.cpu_count(), "kernel": platform.release(),
             "python": platform.python_version(), "loadavg": os.getloadavg()})
    t0 = time.monotonic()
    if "reactors" in which:
        print(f"experiment 1: reactors under idle held polls ({args.profile})", flush=True)
        reactors.run(r_plan, REPO, out, rec, stamp=stamp)
    if "wan" in which:
        print(f"experiment 2: fan-out over a veth (MTU, tbf) ({args.profile})", flush=True)
        wan.run(w_plan, REPO, out, rec, stamp=stamp)
    rec.row({"experiment": "machine-end", "stamp": stamp, "loadavg": os.getloadavg(),
             "elapsed_s": round(time.monotonic() - t0, 1)})
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    for path in figures.draw(rows, out):
        print(f"figure {path}", flush=True)
    (out / "tables.md").write_text(tables.render(rows))
    print(f"tables {out / 'tables.md'}", flush=True)
    print(f"results {results}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
