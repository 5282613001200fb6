"""A CPU budget per server node: one cgroup v1 CPU group each, removed at the end.

    with CpuBudgets("20261126T0100", cores=0.25) as budgets:
        budgets.assign("node1", pid)        # pid (all its threads) now gets 0.25 core
        ...
    # every group removed here, also after an exception or Ctrl-C

The paper's nodes each had a machine of their own; on one shared box a node
gets its own share of the CPU from a group under ``/sys/fs/cgroup/cpu`` named
``pushup-<run>-<node>`` with ``cpu.cfs_period_us`` = 100,000 and
``cpu.cfs_quota_us`` = ``cores`` x 100,000. Only the nodes get budgets: the
load generator, HAProxy and redis-server stay outside every budget (``favour``
may put them in a group of their own with no quota and a larger CPU weight, so
other users of the machine do not starve them).

Where the CPU hierarchy is missing or not writable (not root, cgroup v2 only, a
container) nothing is budgeted: ``available`` is False, ``reason`` says why,
``assign`` returns None, and the constructor prints that the run goes on
without budgets, so no figure is ever taken for a budgeted one by mistake.

Rule: this module only creates, fills and removes its own groups; it never
touches a group it did not create, and it never kills a process. On leaving,
any process still in a group is moved back to the hierarchy's root group
before the group is removed.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000


class CpuBudgets:
    """One CPU cgroup per node of one run (a context manager)."""

    def __init__(self, run: str, cores: float, root: Path = CPU_ROOT,
                 log: Callable[[str], None] = print) -> None:
        if cores <= 0:
            raise ValueError("a budget is a positive number of cores")
        self.run, self.cores, self.root, self.log = run, cores, Path(root), log
        self.quota_us = round(cores * PERIOD_US)
        self.groups: dict[str, Path] = {}
        self.reason = self._probe()
        self.available = self.reason == ""
        if self.available:
            log(f"CPU budgets: {cores:g} core per node (cgroup v1, {self.root}/pushup-{run}-*, "
                f"quota {self.quota_us} us per {PERIOD_US} us)")
        else:
            log(f"CPU budgets: NONE, nodes share the machine unbudgeted ({self.reason})")

    def _probe(self) -> str:
        """Empty if groups can be made here, else why not."""
        if not (self.root / "cpu.cfs_quota_us").exists():
            return f"{self.root} is not a cgroup v1 CPU hierarchy"
        if not os.access(self.root, os.W_OK):
            return f"{self.root} is not writable (needs root)"
        return ""

    def assign(self, node: str, pid: int, quota_us: int | None = None) -> Path | None:
        """Put process ``pid`` (every thread) into node ``node``'s group, made on first
        use with the run's quota (or ``quota_us``, -1 = none); the group's path, or
        None when budgets are not available."""
        if not self.available:
            return None
        group = self.groups.get(node)
        if group is None:
            group = self.root / f"pushup-{self.run}-{node}"
            group.mkdir()
            self.groups[node] = group
            (group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            quota = self.quota_us if quota_us is None else quota_us
            (group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        # cgroup.procs moves the whole thread group, not one thread (as `tasks` would).
        (group / "cgroup.procs").write_text(f"{pid}\n")
        return group

    def favour(self, name: str, pid: int, shares: int) -> Path | None:
        """Put ``pid`` into group ``name`` with no quota (no budget: it may use every
        core) and ``cpu.shares`` = ``shares`` (the root group's tasks weigh 1,024
        each), so under other users' load it still gets the CPU it asks for. For
        the parts that must not be the bottleneck (generator, HAProxy, Redis)."""
        group = self.assign(name, pid, quota_us=-1)
        if group is not None and (group / "cpu.shares").read_text().strip() != str(shares):
            (group / "cpu.shares").write_text(f"{shares}\n")
        return group

    def throttling(self) -> dict[str, dict[str, int]]:
        """Each group's cpu.stat (nr_periods, nr_throttled, throttled_time in ns)."""
        out: dict[str, dict[str, int]] = {}
        for node, group in self.groups.items():
            with contextlib.suppress(OSError, ValueError):
                out[node] = {k: int(v) for k, v in (line.split() for line in
                             (group / "cpu.stat").read_text().splitlines())}
        return out

    def close(self) -> None:
        """Move what is left back to the root group and remove every group."""
        for node, group in list(self.groups.items()):
            deadline = time.monotonic() + 5.0
            while True:
                try:
                    pids = (group / "cgroup.procs").read_text().split()
                except OSError:
                    pids = []
                for pid in pids:
                    with contextlib.suppress(OSError):  # exited meanwhile
                        (self.root / "cgroup.procs").write_text(f"{pid}\n")
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:  # EBUSY: a zombie or a task moving; try again
                    if time.monotonic() > deadline:
                        self.log(f"CPU budgets: could not remove {group}: {e}")
                        break
                    time.sleep(0.05)
            del self.groups[node]

    def __enter__(self) -> CpuBudgets:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
