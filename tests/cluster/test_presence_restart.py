"""A node that restarts (SIGTERM, then started again) does not say again who
was there all along: on 3 real nodes behind HAProxy, on the mesh and on one
redis-server, the webhook receiver sees a member that stayed on another node
added once, not again when the restarted node (the webhooks' sender) comes
back."""
from __future__ import annotations

import signal
import time
from collections import Counter

import pytest

from deploy.launch import LocalCluster
from tests.cluster.test_presence import SECRET, get, names, poll, until, view
from tests.webhook_receiver import Receiver


@pytest.mark.parametrize("engine", ["mesh", "redis"])
def test_a_restarted_sender_does_not_announce_members_again(engine):
    hook = Receiver(SECRET)
    cluster = LocalCluster(nodes=3, haproxy=True, engine=engine, node_args=[
        "--presence", "--presence-window", "1", "--webhook-url", hook.url],
        node_env={"PUSHUP_WEBHOOK_SECRET": SECRET})
    cluster.start()
    try:
        bases = [cluster.node_url(i) for i in range(3)]
        until(lambda: get(f"{bases[0]}/stats")["presence"]["presence_sender"] == 1,
              "node1 to settle as the sender", guard=30)
        ch = f"stay-{time.monotonic_ns()}"
        poll(bases[1], ch, "ann", "ann-tab", timeout=20)  # ann stays on node2 throughout
        hook.wait(lambda r: ("member_added", ch, "ann") in names(r), "ann added")

        cluster.kill(0, signal.SIGTERM)  # node1 drains and exits
        cluster.start_node(0)
        until(lambda: get(f"{bases[0]}/stats")["presence"]["presence_sender"] == 1,
              "node1 back, settled, the sender again", guard=30)
        assert view(bases[0], ch) == (1, ["ann"])
        sentinel = f"sentinel-{time.monotonic_ns()}"
        poll(bases[2], sentinel, "cy", "cy-tab", timeout=0.2).result(20)
        hook.wait(lambda r: ("member_added", sentinel, "cy") in names(r), "the sentinel")
        counted = Counter(n for n in names(hook) if n[1] == ch)
        assert counted == {("channel_occupied", ch, None): 1, ("member_added", ch, "ann"): 1}
    finally:
        cluster.stop()
        hook.close()
