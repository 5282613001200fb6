"""`python -m loadtest.bench [--only memory,fanout,cpu,publish,16k,cluster,propagation,ack,nchan,
engines,interest,scale,capacity,workers,faults,soak,streams,sse_latency,presence] [--quick]
[--budget CORES] [--worker-budget CORES] [--soak-minutes M] [--interest-widths W,...]
[--capacity-workload CxP,...] [--capacity-nodes K,...] [--capacity-step S]`.

Runs the selected benchmarks against fresh `pushup serve` processes, prints a
table of figures versus targets, and writes everything (per-sample figures,
CPU use, client counters, machine load) to loadtest/out/bench-<timestamp>.json.
`nchan` runs fan-out, publish rate and memory side by side against PushUp (1
process), PushUp `--workers 2` and nginx + nchan (compare.py) and prints the
figures with their ratios; it needs `make bench-packages` (nginx, nchan).
`engines` measures a 3-node cluster on the mesh and on Redis side by side
(engines.py; needs redis-server, `make system-packages`). `interest` is issue
37's delivery by interest: on a real 3-primary Redis Cluster, node B holds one
long poll on each of W channels nobody publishes to (W = 20, 200, 2,000 and
8,000; `--interest-widths`), node A takes 8 keep-alive publishers over 1,000
other channels nobody reads, and B's CPU over A's is the figure (target
<= 0.10), with publishes/s, the generator's CPU, B's RSS and the partitions (and
channels) B follows (interest.py). `scale` is the paper's
node scaling (Figures 12-13): 1, 2 and 4 nodes behind HAProxy on each engine,
every node in its own CPU cgroup of `--budget` cores, made and removed by the
run (nodescale.py, loadtest/cgroups.py; unbudgeted, and saying so, where
/sys/fs/cgroup/cpu is not writable). `capacity` is issue 28's cluster publish
capacity: 1, 2 and 4 nodes, each in a cgroup of `--budget` cores, 1,000
channels x 3 long polls through HAProxy, open-loop publishes round robin over
the nodes, stepped up until a step fails (every publish 201, 100 % delivered,
fan-out p99 < 1 s); on Redis with channel-affine balancing, Redis with
keep-alive stickiness, Redis publish-only and the mesh, with ratios to 1 node
(capacity.py); then issue 37's second workload, 19,000 channels x 1 long poll
(one channel per user), on Redis with channel-affine balancing only.
`--capacity-workload 19000x1` measures only the workloads named, in every
mode selected (`--capacity-modes`). `workers` measures `--workers 2` against one process with every
serving process in a CPU cgroup of `--worker-budget`
cores, the generator outside (workerscale.py): what a core per worker buys.
`soak` is steady service for `--soak-minutes` (default 10): 5,000 re-polling
subscribers on 50 channels, a publish per channel a second, the server's RSS a
line per minute and its slope over the last half (soak.py). `streams` is issue
30's: a Durable Stream's catch-up read and long-poll wake-up against the same
through /subscribe on one node, with their ratios (streams.py). `sse_latency` is
issue 40's: one event's latency on an event stream straight from a node, through
the shipped HAProxy (plain and TLS) and through the shipped nginx TLS site, the
fronts taking turns against one node (sse_latency.py; needs haproxy and nginx).
`presence` is issue 38's: one node's CPU per held-poll delivery (fan-out, plain
polls and polls that each name a client and a user) and per publish, with
`--presence` off and on, the sides taking turns, and the ratios (presence.py).
Exit status: 0 when every selected benchmark produced its figures (whether or
not targets were met), 1 when one failed to run, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import (
    capacity,
    cluster,
    compare,
    engines,
    faults,
    interest,
    nodescale,
    presence,
    report,
    scenarios,
    soak,
    sse_latency,
    streams,
    workerscale,
)
from .pool import WorkerPool
from .server import raise_nofile

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "loadtest" / "out"
CHOICES = ["memory", "fanout", "cpu", "publish", "16k", "cluster", "propagation", "ack", "nchan",
           "engines", "interest", "scale", "capacity", "workers", "faults", "soak", "streams",
           "sse_latency", "presence"]

FULL = {"memory_sizes": [1000, 10000], "memory_reps": 3, "fanout_n": 10000,
        "fanout_publishes": 20, "publish_seconds": 10.0, "publish_reps": 3,
        "big_n": 16000, "big_publishes": 3, "round_timeout": 30.0,
        "cluster_nodes": [1, 2, 4], "cluster_n": 10000, "cluster_publishes": 10,
        "lag_samples": 200, "ack_lone": 500, "engines_publish_seconds": 8.0, "engines_reps": 3,
        "engines_n": 10000, "engines_publishes": 10, "engines_scaling": [1, 5],
        "scale_nodes": [1, 2, 4], "scale_n": 4000, "scale_publishes": 10,
        "scale_interval": 1.0, "workers_n": 5000,
        "soak_subscribers": soak.SUBSCRIBERS, "soak_channels": soak.CHANNELS,
        "soak_minutes": soak.MINUTES, "capacity": capacity.Settings(),
        "interest": interest.Settings(),
        "streams_sizes": [10, 1000], "streams_read_seconds": 3.0, "streams_read_reps": 3,
        "streams_holds": [1000, 10000], "streams_rounds": 20, "sse_latency_events": 300,
        "presence_n": 4000, "presence_rounds": 10, "presence_publish_seconds": 3.0,
        "presence_reps": 3}
QUICK = {"memory_sizes": [200, 500], "memory_reps": 1, "fanout_n": 500,
         "fanout_publishes": 3, "publish_seconds": 2.0, "publish_reps": 1,
         "big_n": 1000, "big_publishes": 1, "round_timeout": 10.0,
         "cluster_nodes": [1, 2], "cluster_n": 400, "cluster_publishes": 2,
         "lag_samples": 20, "ack_lone": 50, "engines_publish_seconds": 2.0, "engines_reps": 1,
         "engines_n": 300, "engines_publishes": 2, "engines_scaling": [1],
         "scale_nodes": [1, 2], "scale_n": 300, "scale_publishes": 2, "scale_interval": 0.2,
         "workers_n": 500, "soak_subscribers": 500, "soak_channels": 10, "soak_minutes": 0.25,
         "capacity": capacity.Settings(
             workloads=(capacity.Workload(100, 3),
                        capacity.Workload(300, 1, modes=("redis-affine",))),
             node_counts=(1, 2), step_s=1.5, factor=2.0, start_rate=40.0, refine=False,
             max_steps=2),
         "interest": interest.Settings(widths=(20, 2000), duration_s=4.0),
         "streams_sizes": [20], "streams_read_seconds": 0.5, "streams_read_reps": 1,
         "streams_holds": [200], "streams_rounds": 2, "sse_latency_events": 40,
         "presence_n": 100, "presence_rounds": 2, "presence_publish_seconds": 0.5,
         "presence_reps": 1}
WATCHDOG_S = 1800  # the whole run stops itself after this, whatever happens
CAPACITY_WATCHDOG_S = 2400  # ... and after this much more when it measures capacity


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=",".join(CHOICES),
                    help="comma-separated subset of: " + ",".join(CHOICES)
                    + " (cpu is measured during fanout; either selects that run)")
    ap.add_argument("--quick", action="store_true", help="small numbers for a smoke run")
    ap.add_argument("--workers", type=int, default=2,
                    help="load-generator processes (default 2, this box has 2 cores)")
    ap.add_argument("--server", default=str(REPO / ".venv" / "bin" / "pushup"),
                    help="server command (default: the venv's pushup); split like a shell")
    ap.add_argument("--publishers", type=int, default=8)
    ap.add_argument("--results", action="store_true",
                    help="scale: write its record, table and Figures 12-13 to the committed "
                    "loadtest/results/nodes (default: loadtest/out/scale-<timestamp>)")
    ap.add_argument("--front-shares", type=int, default=10240,
                    help="scale, capacity: HAProxy, redis-server and the generator in one "
                    "unbudgeted "
                    "cgroup with this cpu.shares, 10x a root-group task's weight, so other "
                    "users of the machine do not make them the bottleneck (0: left in the "
                    "root group)")
    ap.add_argument("--budget", type=float, default=0.1,
                    help="scale, capacity: CPU cores per node, each node in its own cgroup "
                    "(default 0.1:"
                    " 4 nodes take 0.4 of this box's 2 cores, so the unbudgeted HAProxy and "
                    "generator are not what the trip time measures; docs/benchmarks.md)")
    ap.add_argument("--redis-partitions", type=int,
                    help="capacity: the nodes' --redis-partitions (default: theirs, 1,024)")
    ap.add_argument("--capacity-modes",
                    help="capacity: comma-separated subset of: "
                    + ",".join(capacity.MODES) + " (default: all)")
    ap.add_argument("--capacity-workload",
                    help="capacity: comma-separated CHANNELSxPOLLS workloads to measure, "
                    "each in every mode selected (default: 1000x3 in every mode and "
                    "19000x1 with redis-affine only)")
    ap.add_argument("--capacity-nodes",
                    help="capacity: comma-separated node counts (default 1,2,4; --quick 1,2)")
    ap.add_argument("--capacity-step", type=float,
                    help="capacity: seconds a rate step lasts (default 10, --quick 1.5)")
    ap.add_argument("--interest-widths",
                    help="interest: comma-separated numbers of channels node B holds "
                    "(default 20,200,2000,8000; --quick 20,2000)")
    ap.add_argument("--worker-budget", type=float, default=0.2,
                    help="workers: CPU cores per serving process (default 0.2: two workers "
                    "take 0.4 of this box's 2 cores, so the unbudgeted generator, which "
                    "needs about as much CPU per delivery as PushUp, is not what the "
                    "figures measure; docs/benchmarks.md)")
    ap.add_argument("--repoll", choices=["immediate", "after-round"], default="immediate",
                    help="fan-out subscribers re-poll on receipt (default) or only after "
                    "every subscriber has the publish (separates fan-out from re-poll cost)")
    ap.add_argument("--subscribers", type=int, help="override the fan-out subscriber count")
    ap.add_argument("--presence-against", metavar="SERVER",
                    help="presence: also measure this server command (split like a shell), "
                    "presence off, beside the others: e.g. another checkout's node")
    ap.add_argument("--soak-minutes", type=float,
                    help="soak: how long the steady load runs (default 10, --quick 0.25)")
    ap.add_argument("--publishes", type=int, help="override the fan-out publish count")
    args = ap.parse_args(argv)
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    bad = [x for x in args.only if x not in CHOICES]
    if bad:
        ap.error(f"unknown benchmark(s) {bad}; choose from {CHOICES}")
    if args.capacity_modes:
        args.capacity_modes = [x.strip() for x in args.capacity_modes.split(",") if x.strip()]
        bad = [x for x in args.capacity_modes if x not in capacity.MODES]
        if bad:
            ap.error(f"unknown capacity mode(s) {bad}; choose from {list(capacity.MODES)}")
    try:
        if args.capacity_workload:
            # (each once: a workload named twice would overwrite its own figures)
            args.capacity_workload = list(dict.fromkeys(
                capacity.parse_workload(x) for x in args.capacity_workload.split(",")
                if x.strip()))
        args.capacity_nodes = _counts(args.capacity_nodes, "--capacity-nodes")
        args.interest_widths = _counts(args.interest_widths, "--interest-widths")
    except ValueError as e:
        ap.error(str(e))
    if args.capacity_step is not None and args.capacity_step <= 0:
        ap.error("--capacity-step must be a positive number of seconds")
    if args.soak_minutes is not None and args.soak_minutes <= 0:
        ap.error("--soak-minutes must be positive")
    if args.budget <= 0:
        ap.error("--budget must be a positive number of cores")
    if not 1 <= args.workers <= 8:
        ap.error("--workers must be 1..8")
    return args


def _counts(text: str | None, flag: str) -> tuple[int, ...] | None:
    """``"1,2,4"`` -> (1, 2, 4); None when the flag was not given."""
    if text is None:
        return None
    try:
        counts = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated whole numbers, not {text!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"{flag} takes comma-separated numbers of at least 1, not {text!r}")
    return counts


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "nofile_hard": raise_nofile(),
    }


def _terminate(signum: int, _frame: Any) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.subscribers:
        cfg["fanout_n"] = args.subscribers
    if args.publishes:
        cfg["fanout_publishes"] = args.publishes
    if args.soak_minutes is not None:
        cfg["soak_minutes"] = args.soak_minutes
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGALRM, _terminate)
    # a soak is long by design: the watchdog gives it its own minutes on top; so is
    # the capacity bench (about 15 min for 1,000 x 3 in four modes, and as long again
    # for 19,000 x 1, whose polls a node on 0.1 core takes minutes to hold)
    signal.alarm(WATCHDOG_S + (int(cfg["soak_minutes"] * 60) if "soak" in args.only else 0)
                 + (CAPACITY_WATCHDOG_S if "capacity" in args.only and not args.quick else 0))
    stamp = time.strftime("%Y%m%dT%H%M%S")
    OUT.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "python -m loadtest.bench " + " ".join(shlex.quote(a) for a in
                                                          (argv or sys.argv[1:])),
        "quick": args.quick, "settings": {**cfg, "workers": args.workers,
                                          "publishers": args.publishers,
                                          "repoll": args.repoll,
                                          # relative to the checkout: a record names
                                          # no path of the machine that made it
                                          "server": args.server.replace(f"{REPO}/", "")},
        "machine": machine(),
        "results": {},
    }
    results: dict[str, Any] = record["results"]
    t_start = time.monotonic()
    with WorkerPool(args.workers) as pool:
        ctx = scenarios.Context(pool=pool, server_command=shlex.split(args.server), repo=REPO,
                                out_dir=OUT, stamp=stamp,
                                log=lambda m: print(m, flush=True))
        plan: list[tuple[str, Any]] = []
        if "memory" in args.only:
            plan.append(("memory", lambda: scenarios.bench_memory(
                ctx, cfg["memory_sizes"], cfg["memory_reps"])))
        if "fanout" in args.only or "cpu" in args.only:
            plan.append(("fanout", lambda: scenarios.bench_fanout(
                ctx, "fanout", cfg["fanout_n"], cfg["fanout_publishes"], cfg["round_timeout"],
                args.repoll == "immediate")))
        if ("fanout" in args.only or "cpu" in args.only) and args.repoll == "immediate":
            # Diagnostic: the same fan-out with re-polls held back until every subscriber
            # has the message, so the server's fan-out cost shows apart from re-poll cost.
            plan.append(("fanout_deferred", lambda: scenarios.bench_fanout(
                ctx, "fanout-deferred", cfg["fanout_n"], max(3, cfg["fanout_publishes"] // 2),
                cfg["round_timeout"], False)))
        if "publish" in args.only:
            plan.append(("publish", lambda: scenarios.bench_publish(
                ctx, args.publishers, cfg["publish_seconds"], cfg["publish_reps"])))
        if "16k" in args.only:
            plan.append(("16k", lambda: scenarios.bench_fanout(
                ctx, "16k", cfg["big_n"], cfg["big_publishes"], cfg["round_timeout"],
                args.repoll == "immediate")))
        if "cluster" in args.only:
            plan.append(("cluster", lambda: cluster.bench_cluster_fanout(
                ctx, cfg["cluster_nodes"], cfg["cluster_n"], cfg["cluster_publishes"],
                cfg["round_timeout"])))
        if "propagation" in args.only:
            plan.append(("propagation", lambda: cluster.bench_propagation(
                ctx, args.publishers, cfg["publish_seconds"], cfg["lag_samples"])))
        if "ack" in args.only:
            plan.append(("ack", lambda: cluster.bench_publish_ack(
                ctx, args.publishers, cfg["publish_seconds"], cfg["ack_lone"])))
        if "nchan" in args.only:
            plan.append(("nchan", lambda: compare.bench_compare(
                ctx, cfg["fanout_n"], cfg["fanout_publishes"], cfg["round_timeout"],
                args.publishers, cfg["publish_seconds"], cfg["publish_reps"],
                cfg["memory_reps"])))
        if "engines" in args.only:
            plan.append(("engines", lambda: engines.bench_engines(
                ctx, args.publishers, cfg["engines_publish_seconds"], cfg["engines_reps"],
                cfg["lag_samples"], cfg["engines_n"], cfg["engines_publishes"],
                cfg["round_timeout"], cfg["engines_scaling"])))
        if "interest" in args.only:
            wide = cfg["interest"]
            if args.interest_widths:
                wide = dataclasses.replace(wide, widths=args.interest_widths)
            plan.append(("interest", lambda: interest.bench_interest(ctx, wide)))
        if "workers" in args.only:
            plan.append(("workers", lambda: workerscale.bench_worker_scaling(
                ctx, cfg["workers_n"], cfg["fanout_publishes"], cfg["round_timeout"],
                args.publishers, cfg["publish_seconds"], cfg["publish_reps"],
                args.worker_budget)))
        if "scale" in args.only:
            plan.append(("scale", lambda: nodescale.bench_node_scaling(
                ctx, cfg["scale_nodes"], cfg["scale_n"], cfg["scale_publishes"],
                cfg["scale_interval"], args.budget, cfg["round_timeout"], args.front_shares)))
        if "capacity" in args.only:
            settings = cfg["capacity"]
            if args.redis_partitions:
                settings = dataclasses.replace(settings, partitions=args.redis_partitions)
            if args.capacity_modes:
                settings = dataclasses.replace(settings, modes=tuple(args.capacity_modes))
            if args.capacity_workload:
                settings = dataclasses.replace(settings, workloads=tuple(args.capacity_workload))
            if args.capacity_nodes:
                settings = dataclasses.replace(settings, node_counts=args.capacity_nodes)
            if args.capacity_step:
                settings = dataclasses.replace(settings, step_s=args.capacity_step)
            plan.append(("capacity", lambda: capacity.bench_capacity(
                ctx, settings, args.budget, args.front_shares)))
        if "faults" in args.only:
            plan.append(("faults", lambda: faults.bench_faults(ctx, args.quick)))
        if "soak" in args.only:
            plan.append(("soak", lambda: soak.bench_soak(
                ctx, cfg["soak_subscribers"], cfg["soak_channels"], cfg["soak_minutes"])))
        if "streams" in args.only:
            plan.append(("streams", lambda: streams.bench_streams(
                ctx, cfg["streams_sizes"], cfg["streams_read_seconds"], cfg["streams_read_reps"],
                cfg["streams_holds"], cfg["streams_rounds"], cfg["round_timeout"])))
        if "sse_latency" in args.only:
            plan.append(("sse_latency", lambda: sse_latency.bench_sse_latency(
                ctx, cfg["sse_latency_events"])))
        if "presence" in args.only:
            plan.append(("presence", lambda: presence.bench_presence(
                ctx, cfg["presence_n"], cfg["presence_rounds"], cfg["round_timeout"],
                args.publishers, cfg["presence_publish_seconds"], cfg["presence_reps"],
                shlex.split(args.presence_against) if args.presence_against else None)))
        for name, run in plan:
            print(f"== {name}", flush=True)
            t0 = time.monotonic()
            try:
                results[name] = run()
            except Exception as e:  # one broken benchmark must not hide the others
                traceback.print_exc()
                results[name] = {"error": f"{type(e).__name__}: {e}"}
                try:
                    pool.close_all()
                except Exception:
                    pass
            print(f"   ({time.monotonic() - t0:.0f} s)", flush=True)
    record["duration_s"] = round(time.monotonic() - t_start, 1)
    record["machine"]["loadavg_at_end"] = os.getloadavg()
    rows = report.rows(results, targets_apply=not args.quick)
    record["table"] = rows
    side = results.get("nchan")
    if isinstance(side, dict) and "labels" in side:
        record["side_by_side"] = {"figures": report.compare_rows(side),
                                  "targets": report.compare_targets(side)}
    eng = results.get("engines")
    if isinstance(eng, dict) and "engines" in eng:
        record["engines_side_by_side"] = engines.rows(eng)
    path = OUT / f"bench-{stamp}.json"
    path.write_text(json.dumps(record, indent=2, default=str))
    if rows:  # (none when only the side-by-side comparison ran)
        print()
        if args.quick:
            print("(--quick: small numbers, targets not applied)")
        print(report.table(rows))
    if "side_by_side" in record:
        print()
        print(report.compare_table(side, quick=args.quick))
    if "engines_side_by_side" in record:
        print()
        print(engines.table(eng))
    # each benchmark's own table, when its figures are in (the key its
    # results always hold says so), in this order
    for name, key, table in (("interest", "widths", interest.table),
                             ("capacity", "workloads", capacity.table),
                             ("workers", "fanout", workerscale.table),
                             ("scale", "engines", nodescale.table),
                             ("streams", "wake_up", streams.table),
                             ("sse_latency", "fronts", sse_latency.table),
                             ("presence", "ratios", presence.table)):
        figures = results.get(name)
        if not (isinstance(figures, dict) and key in figures):
            continue
        print()
        print(table(figures))
        if name == "scale":  # (its report too)
            where = (REPO / "loadtest" / "results" / "nodes" if args.results
                     else OUT / f"scale-{stamp}")
            nodescale.write(record, figures, where)
            print(f"node scaling: {where.relative_to(REPO)}/report.md")
    print(f"\nmachine: {record['machine']['cores']} cores, load average "
          f"{record['machine']['loadavg_at_start'][0]:.2f} at start, "
          f"{record['machine']['loadavg_at_end'][0]:.2f} at end; run took "
          f"{record['duration_s']:.0f} s")
    print(f"written: {path.relative_to(REPO)}")
    return 1 if any(isinstance(r, dict) and "error" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
