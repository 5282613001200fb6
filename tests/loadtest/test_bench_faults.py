"""The network-fault benchmark at tiny scale, for real: ``python -m loadtest.bench
--quick --only faults`` in a subprocess (four fresh clusters in network namespaces,
a redis-server) reports every figure of every fault, and leaves no namespace,
interface or process behind. It asserts what the run produced, not whether the
cluster kept its promises (tests/cluster/test_faults.py does that), and no timing.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from tests.cluster.netfault import skip_reason
from tests.loadtest.quick_bench import run_quick_bench
from tests.toolkit import alive

REASON = skip_reason()
FIGURES = ["published", "acked", "unacked", "unacked_delivered", "deliveries", "delayed",
           "max_lag_s", "max_lag_during_cut_s", "gaps", "cut_s", "heal_s", "poll_failures"]


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True,
                         check=True).stdout
    return {line.split(": ")[1].split("@")[0] for line in out.splitlines()}


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.timeout(170)
def test_quick_faults_report_every_cost_and_leave_nothing_behind() -> None:
    ns0, links0 = namespaces(), links()
    stdout, path = run_quick_bench("--only", "faults")
    res: dict[str, Any] = json.loads(path.read_text())["results"]["faults"]
    assert "error" not in res, res["error"]
    assert set(res["faults"]) == {"member_cut", "redis_cut", "one_way", "slow_link"}
    for key, f in res["faults"].items():
        assert f["what"] in stdout, key  # the table names every fault
        assert all(isinstance(f[k], int | float) for k in FIGURES), (key, f)
        assert f["acked"] > 0 and f["deliveries"] > 0 and f["cut_s"] > 0, (key, f)
        assert f["kept"] is (f["problem_count"] == 0), (key, f)
    # the partitions refused some publishes: the cut held while the load ran
    assert res["faults"]["member_cut"]["unacked"] > 0
    assert res["faults"]["redis_cut"]["unacked"] > 0
    # everything the run made is gone (others' namespaces may come and go meanwhile)
    assert not {n for n in namespaces() - ns0 if n.startswith("pushup-")}
    assert not {n for n in links() - links0 if n.startswith("pf")}
    started = [pid for f in res["faults"].values() for pid in f["pids"]]
    assert len(started) == 1 + 4 * 3  # a redis-server, and 3 nodes per fault
    assert not [pid for pid in started if alive(pid)]
