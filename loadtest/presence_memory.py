"""What presence costs in memory: ``python -m loadtest.presence_memory``.

Builds this node's subscriptions (``pushup.core.presence.Presence``) and the
cluster's roster (``pushup.core.roster.Roster``) as a node with ``--presence``
holds them, in two shapes the issue names: 10,000 members in one channel,
and 100,000 channels with one member each; prints the bytes each costs
(``tracemalloc``: Python objects, what ``/stats`` ``rss_bytes`` grows by, give
or take the allocator) and the size of the state one node sends a peer that
lost track of it (the mesh's 409, a Redis record). A held poll's own cost
(connection, request) is apart: docs/benchmarks.md measures it.
"""

from __future__ import annotations

import gc
import json
import tracemalloc

from pushup.core.presence import Presence, state_json
from pushup.core.roster import Roster

WINDOW = 55_000_000


def measure(channels: int, per_channel: int) -> dict[str, float]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    local = Presence(WINDOW)
    roster = Roster()
    n = 0
    for c in range(channels):
        name = f"channel-{c:06d}"
        for _ in range(per_channel):
            n += 1
            roster.apply("node1.abc", local.hold(f"c:tab{n:07d}\n{name}", f"user{n:07d}",
                                                 None, (name,)))
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    state = len(json.dumps(state_json(local.state()), separators=(",", ":")))
    return {"members": n, "channels": channels, "bytes": used,
            "bytes_per_member": used / n, "state_bytes": state,
            "state_bytes_per_member": state / n}


def main() -> None:
    for channels, per_channel in ((1, 10_000), (100_000, 1)):
        m = measure(channels, per_channel)
        print(f"{m['channels']:>7} channels x {per_channel:>6} members: "
              f"{m['bytes'] / 2**20:6.1f} MiB, {m['bytes_per_member']:5.0f} B a member "
              f"(subscription, member, roster entry, follower log); state for a peer "
              f"{m['state_bytes'] / 2**20:5.1f} MiB, {m['state_bytes_per_member']:3.0f} B a member")


if __name__ == "__main__":
    main()
