"""Presence on 3 real nodes behind HAProxy, on the mesh and on a Redis Cluster:
one user with tabs on two nodes is one member, every node says the same
within the bound, a SIGKILLed node's users leave once, and the webhook
receiver sees each change once cluster-wide."""
from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections import Counter

import pytest

from deploy.launch import LocalCluster
from tests.e2e.support import Pending
from tests.webhook_receiver import Receiver

SECRET = "cluster-webhook-secret"
BOUND_S = 10.0  # hang guard only: the stated bound is DEAD_S + a tick (docs/api.md)


def get(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def presence(base: str, ch: str) -> dict:
    return get(f"{base}/presence?channels={urllib.parse.quote(ch)}&members=1")["channels"][ch]


def poll(base: str, ch: str, user: str, client: str, timeout: float = 8) -> Pending:
    q = urllib.parse.urlencode({"channels": ch, "since": "now", "timeout": timeout,
                                "user": user, "client": client})

    def run():
        try:
            return get(f"{base}/subscribe?{q}", timeout=timeout + 10)
        except OSError as e:  # its node was killed
            return e
    return Pending(run)


def until(condition, what: str, guard: float = BOUND_S):
    deadline = time.monotonic() + guard
    while True:
        try:
            value = condition()
        except OSError:
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"hang guard: {what} not within {guard} s"
        time.sleep(0.05)


def view(base: str, ch: str) -> tuple[int, list[str]]:
    seen = presence(base, ch)
    return seen["occupancy"], sorted(m["user"] for m in seen["members"])


@pytest.fixture(params=["mesh", "redis-cluster"])
def presence_cluster(request):
    hook = Receiver(SECRET)
    cluster = LocalCluster(nodes=3, haproxy=True, engine=request.param, node_args=[
        "--presence", "--presence-window", "1", "--webhook-url", hook.url],
        node_env={"PUSHUP_WEBHOOK_SECRET": SECRET})
    cluster.start()
    try:
        bases = [cluster.node_url(i) for i in range(3)]
        # every node knows the others', and node1 says the events (once settled)
        until(lambda: [(s["presence_nodes"], s["presence_sender"]) for s in
                       (get(f"{b}/stats")["presence"] for b in bases)] == [(3, 1), (3, 0), (3, 0)],
              "every node to know the others' presence, node1 the sender", guard=30)
        yield cluster, bases, hook
    finally:
        cluster.stop()
        hook.close()


def test_one_user_on_two_nodes_is_one_member_everywhere_and_a_killed_node_leaves_once(
        presence_cluster):
    cluster, bases, hook = presence_cluster
    ch = f"room-{time.monotonic_ns()}"
    # ann: a tab on node2 and one on node3; bob on node1 (the webhooks' sender)
    for base, user, tab in ((bases[1], "ann", "ann-tab1"), (bases[2], "ann", "ann-tab2"),
                            (bases[0], "bob", "bob-tab")):
        poll(base, ch, user, tab)  # held (answered at the drain, or cut by the kill)
    for base in [*bases, cluster.front_url]:  # every node, and through HAProxy
        until(lambda b=base: view(b, ch) == (3, ["ann", "bob"]), f"{base}: 3 tabs, 2 users")
    changes = [("channel_occupied", ch, None), ("member_added", ch, "ann"),
               ("member_added", ch, "bob")]
    hook.wait(lambda r: all(c in names(r) for c in changes), "the joins")

    cluster.kill(0)  # node1, with bob's tab and the webhooks' sender, SIGKILLed
    for base in bases[1:]:
        until(lambda b=base: view(b, ch) == (2, ["ann"]), f"{base}: bob gone")
    hook.wait(lambda r: ("member_removed", ch, "bob") in names(r), "bob's leave, from node2")

    # each change once: a last change, after everything before it was sent
    sentinel = f"sentinel-{time.monotonic_ns()}"
    poll(bases[1], sentinel, "cy", "cy-tab", timeout=0.2).result(20)
    hook.wait(lambda r: ("member_added", sentinel, "cy") in names(r), "the sentinel")
    counted = Counter(n for n in names(hook) if n[1] == ch)
    assert counted[("member_added", ch, "ann")] == 1
    assert counted[("member_added", ch, "bob")] == 1
    assert counted[("member_removed", ch, "bob")] == 1
    assert counted[("channel_occupied", ch, None)] == 1
    assert all(r["valid"] for r in hook.requests)
    ids = [e["id"] for e in hook.accepted()]
    assert len(ids) == len(set(ids))


def names(receiver: Receiver) -> list[tuple[str, str, str | None]]:
    return [(e["name"], e["channel"], e.get("user")) for e in receiver.accepted()]
