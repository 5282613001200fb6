"""loadtest.cgroups: a CPU group per node is made, applied to every thread of
the process, and removed at the end (also when the run fails); where there is
no writable cgroup v1 CPU hierarchy the run goes on without budgets and says so.

Real cgroups (the test machine runs as root with cgroup v1 mounted at
/sys/fs/cgroup/cpu), a real child process with two threads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.cgroups import CPU_ROOT, CpuBudgets

# Two threads, so "every thread moved" is checked, not only the main one.
CHILD = ("import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); "
         "print('up', flush=True); time.sleep(60)")


def _child() -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    return proc


def _cpu_group(pid: int, tid: int | None = None) -> str:
    path = f"/proc/{pid}/task/{tid}/cgroup" if tid else f"/proc/{pid}/cgroup"
    for line in Path(path).read_text().splitlines():
        _, controllers, group = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return group
    raise AssertionError(f"no cpu controller line in {path}")


def test_a_group_per_node_holds_every_thread_with_its_quota_and_is_removed() -> None:
    lines: list[str] = []
    proc = _child()
    run = f"test-{os.getpid()}"
    try:
        with CpuBudgets(run, cores=0.25, log=lines.append) as budgets:
            assert budgets.available
            group = budgets.assign("node1", proc.pid)
            assert group == CPU_ROOT / f"pushup-{run}-node1"
            assert (group / "cpu.cfs_period_us").read_text() == "100000\n"
            assert (group / "cpu.cfs_quota_us").read_text() == "25000\n"
            assert (group / "cgroup.procs").read_text().split() == [str(proc.pid)]
            tids = os.listdir(f"/proc/{proc.pid}/task")
            assert len(tids) == 2
            assert sorted((group / "tasks").read_text().split()) == sorted(tids)
            assert {_cpu_group(proc.pid, int(t)) for t in tids} == {f"/pushup-{run}-node1"}
        assert not group.exists()
        assert _cpu_group(proc.pid) == "/"  # alive, and back in the root group
        assert lines == [f"CPU budgets: 0.25 core per node (cgroup v1, {CPU_ROOT}/pushup-{run}-*,"
                         " quota 25000 us per 100000 us)"]
    finally:
        proc.kill()
        proc.wait()


def test_groups_are_removed_when_the_run_fails() -> None:
    proc, other = _child(), _child()
    run = f"test-fail-{os.getpid()}"
    groups: list[Path | None] = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with CpuBudgets(run, cores=0.3, log=lambda _: None) as budgets:
                groups.append(budgets.assign("node1", proc.pid))
                groups.append(budgets.assign("node2", other.pid))
                raise KeyboardInterrupt
        assert groups == [CPU_ROOT / f"pushup-{run}-node1", CPU_ROOT / f"pushup-{run}-node2"]
        assert not any(g.exists() for g in groups if g is not None)
        assert sorted(p.name for p in CPU_ROOT.glob(f"pushup-{run}-*")) == []
        assert _cpu_group(proc.pid) == "/" and _cpu_group(other.pid) == "/"
    finally:
        for p in (proc, other):
            p.kill()
            p.wait()


def test_without_a_cgroup_hierarchy_it_runs_unbudgeted_and_says_so(tmp_path: Path) -> None:
    lines: list[str] = []
    with CpuBudgets("test", cores=0.25, root=tmp_path, log=lines.append) as budgets:
        assert not budgets.available
        assert budgets.assign("node1", os.getpid()) is None
    assert lines == [f"CPU budgets: NONE, nodes share the machine unbudgeted ({tmp_path} is "
                     "not a cgroup v1 CPU hierarchy)"]
    assert list(tmp_path.iterdir()) == []


def test_the_load_test_runner_budgets_each_node_and_removes_the_groups(tmp_path: Path) -> None:
    from loadtest.paper.run import Server

    run = f"test-run-{os.getpid()}"
    server = Server("elp", 2, 10, tmp_path, budget=0.1, run=run)
    try:
        server.start()
        nodes = server.pids()["server"]
        assert len(nodes) == 2
        for i, pid in enumerate(nodes):
            group = CPU_ROOT / f"pushup-{run}-node{i + 1}"
            assert _cpu_group(pid) == f"/{group.name}"
            assert (group / "cpu.cfs_quota_us").read_text() == "10000\n"
        assert [_cpu_group(pid) for pid in server.pids()["haproxy"]] == ["/"]  # not budgeted
    finally:
        server.stop()
    assert sorted(p.name for p in CPU_ROOT.glob(f"pushup-{run}-*")) == []
