"""`python -m loadtest.bench.publishprof [--seconds S] [--publishers P] [--perf FILE]
[--strace FILE] [--pyspy FILE] [--server CMD]`: keep-alive publishes over loopback to one fresh
`pushup serve`, with a profiler attached to the server for the whole run.

The same load as the publish part of ``--only nchan`` (the bench's load-generator
workers, P keep-alive publishers, no subscriber), for S seconds (default 8). It
prints the publishes answered 201, the server's CPU per publish (from /proc), and
the generator's CPU, so a profile can be read against the figure it explains.

``--perf FILE``: ``perf record -g`` (frame pointers: our C and mypyc's; Python
3.11's own frames show as ``_PyEval_EvalFrameDefault``) of the server, written to
FILE. ``--strace FILE``: ``strace -c -f`` of the server, its table written to FILE
(strace slows every call it counts: read the counts per publish, not the CPU).
``--pyspy FILE``: ``py-spy record --native --format raw`` (Python frames and the
compiled core's C frames, one stack per line with its count: inclusive and self
shares can be summed from it), where py-spy is installed.
The profiler is started and stopped by PID, as is the server (``Server``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import procfs
from .pool import WorkerPool
from .server import Server

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "loadtest" / "out"


def attach(args: argparse.Namespace, pid: int) -> subprocess.Popen[bytes] | None:
    """The profiler the arguments ask for, attached to ``pid`` (or None)."""
    if args.perf:
        command = ["/usr/bin/perf", "record", "-g", "-F", "999", "-o", args.perf, "-p", str(pid)]
    elif args.pyspy:
        py_spy = Path(sys.executable).with_name("py-spy")
        command = [str(py_spy if py_spy.exists() else "py-spy"), "record", "--native",
                   "--rate", "250", "--format", "raw", "-o", args.pyspy, "--pid", str(pid)]
    elif args.strace:
        command = ["strace", "-c", "-f", "-o", args.strace, "-p", str(pid)]
    else:
        return None
    profiler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # attaching takes a moment; the load starts after it
    return profiler


def detach(profiler: subprocess.Popen[bytes] | None) -> None:
    if profiler is None:
        return
    profiler.send_signal(signal.SIGINT)  # both write their table or file on SIGINT
    try:
        profiler.wait(60)
    except subprocess.TimeoutExpired:
        profiler.kill()
        profiler.wait()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench.publishprof",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--publishers", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2, help="load-generator processes")
    ap.add_argument("--perf", help="perf record -g of the server into this file")
    ap.add_argument("--strace", help="strace -c -f of the server; its table into this file")
    ap.add_argument("--pyspy", help="py-spy record --native of the server into this file")
    ap.add_argument("--server", default=str(REPO / ".venv" / "bin" / "pushup"))
    args = ap.parse_args(argv)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    with WorkerPool(args.workers) as pool:
        command = [*shlex.split(args.server), "serve", "--port", "0"]
        with Server(command, OUT / f"server-{stamp}-publishprof.log", REPO) as srv:
            srv.warm_up()
            profiler = attach(args, srv.pid)
            try:
                before = srv.stats()["published"]
                a = procfs.snapshot(srv.pids, pool.pids + [os.getpid()])
                _, counters = pool.publish(srv.port, args.publishers, args.seconds,
                                           "bench-pub")
                b = procfs.snapshot(srv.pids, pool.pids + [os.getpid()])
            finally:
                detach(profiler)
            published = srv.stats()["published"] - before
            pool.close_all()
    usage = procfs.usage(a, b)
    ok = counters.get("publish_ok", 0)
    print(f"{ok} publishes answered 201 in {args.seconds:g} s ({ok / args.seconds:,.0f}/s; "
          f"the server counted {published}); server CPU {usage['server_cpu_s']:.2f} s = "
          f"{usage['server_cpu_s'] / max(ok, 1) * 1e6:.1f} µs per publish; "
          f"generator {usage['generator_cpu_pct']}% of a core; load average "
          f"{os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
