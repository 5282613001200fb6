"""Presence on against off at tiny scale, for real:
``python -m loadtest.bench --quick --only presence``.

Fresh `pushup serve` processes, presence off and on: 100 long polls of plain
subscribers and 100 that each name a client and a user, two publishes each,
and keep-alive publishes. Checks that every poll got every publish on both
sides (the scenario raises on one left unanswered), that the node's and the
generator's CPU are both recorded per delivery and per publish, that the
members' polls really were members (the node with presence counted them) and
that the table prints the ratios. It asserts no timing.
"""

from __future__ import annotations

import json

import pytest

from tests.loadtest.quick_bench import run_quick_bench


@pytest.mark.timeout(150)
def test_quick_presence_bench_measures_both_sides_and_prints_the_ratios() -> None:
    stdout, path = run_quick_bench("--only", "presence")
    res = json.loads(path.read_text())["results"]["presence"]
    assert "error" not in res, res["error"]
    for key in ("plain_off", "plain_on", "members_off", "members_on"):
        (fan,) = res[key]["fanout"]["samples"]
        assert fan["delivered_pct"] == 100.0, (key, fan)
        assert {"server_us_per_delivery", "generator_us_per_delivery"} <= fan.keys()
    for key in ("plain_off", "plain_on"):
        (pub,) = res[key]["publish"]["samples"]
        assert pub["client_counters"]["publish_ok"] > 0
        assert {"server_us_per_publish", "generator_us_per_publish"} <= pub.keys()
    assert res["members_on"]["fanout"]["samples"][0]["members_counted"] == 100
    assert res["plain_on"]["fanout"]["samples"][0]["members_counted"] == 0
    assert res["members_off"]["fanout"]["samples"][0]["members_counted"] is None
    assert {"plain_fanout", "plain_publish", "members_fanout"} <= res["ratios"].keys()
    assert "Presence on against off, one node" in stdout
    assert "members polls: node CPU per delivery" in stdout
