"""A real node expires channels named by pull subscribes, with no other traffic."""
from __future__ import annotations

from tests.e2e.support import uniq, wait_until


def test_channels_named_by_pull_subscribes_expire_without_other_traffic(start_node):
    n = start_node("--channel-ttl", "1")
    prefix = uniq("pull")
    names = [f"{prefix}-{k}" for k in range(640)]
    for k in range(0, len(names), 64):
        body = n.subscribe(names[k:k + 64], timeout=0)
        assert body["messages"] == [], body
    assert n.stats()["channels"] == len(names)
    # Only /stats from here on: it reads the figures and touches no channel.
    wait_until(lambda: n.stats()["channels"] == 0, timeout=15, interval=0.1,
               msg="every pulled channel expired")
    r = n.channel_info(names[0])
    assert r.status == 404, r
