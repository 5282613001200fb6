"""CPU seconds and resident memory of processes and the machine, read from /proc.

This module only reads files (Linux `/proc`); it never starts or signals
anything. CPU figures have the kernel's clock-tick resolution (10 ms here).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` in seconds (threads included, children not)."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    # The command name may contain spaces or parentheses; fields resume after the last ')'.
    fields = data[data.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), None if it is gone: with the pid,
    an identity that survives pid reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def descendants(pid: int) -> list[int]:
    """`pid` and every live process below it (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                data = f.read()
        except OSError:  # gone meanwhile
            continue
        ppid = int(data[data.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss_bytes(pid: int) -> int:
    """VmRSS of `pid` in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores."""
    with open("/proc/stat") as f:
        parts = f.readline().split()
    # user nice system idle iowait irq softirq steal guest guest_nice; guest is inside user.
    ticks = [int(x) for x in parts[1:9]]
    idle = ticks[3] + ticks[4]
    return (sum(ticks) - idle) / CLK_TCK, sum(ticks) / CLK_TCK


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """CPU counters at one instant: the server, the load generator, the machine."""

    wall: float
    server: float  # all of the server's processes
    generator: float
    machine_busy: float
    machine_total: float


def snapshot(server_pids: list[int], generator_pids: list[int]) -> Snapshot:
    busy, total = machine_cpu()
    return Snapshot(
        wall=time.monotonic(),
        server=sum(cpu_seconds(p) for p in server_pids),
        generator=sum(cpu_seconds(p) for p in generator_pids),
        machine_busy=busy,
        machine_total=total,
    )


def usage(a: Snapshot, b: Snapshot) -> dict[str, float]:
    """CPU used between two snapshots; percentages are of one core."""
    wall = max(b.wall - a.wall, 1e-9)
    server = b.server - a.server
    generator = b.generator - a.generator
    machine = b.machine_busy - a.machine_busy
    return {
        "wall_s": round(wall, 3),
        "server_cpu_s": round(server, 3),
        "server_cpu_pct": round(100 * server / wall, 1),
        "generator_cpu_s": round(generator, 3),
        "generator_cpu_pct": round(100 * generator / wall, 1),
        # Everything else that ran on the machine meanwhile (other tenants, the kernel's
        # softirq work not charged to a process): the noise floor of the figure.
        "others_cpu_s": round(max(machine - server - generator, 0.0), 3),
        "others_cpu_pct": round(100 * max(machine - server - generator, 0.0) / wall, 1),
        "machine_cores": round((b.machine_total - a.machine_total) / wall, 2),
    }
