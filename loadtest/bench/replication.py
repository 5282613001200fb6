"""`python -m loadtest.bench.replication [PUBLISHES] [--per-turn N] [--profile]`:
what a sibling worker costs each side, in process (a ``task.Clock`` with a heap,
string transports, no sockets, no reactor).

Node A takes publishes on 8 keep-alive connections, 3 a reactor turn
(``--per-turn``: as many messages go in each batch), and answers each 201;
with a sibling, its link to node B is a pipe whose socket takes every frame
whole (tests/backplane/mesh/pipe.py), so a 201 counts the sibling's socket
as with ``--workers``. Prints the CPU time per publish of
node A alone, of node A with the sibling, and of delivering the turn's frames
to B and B's answers back (B's apply plus A reading the answers), best of 3
(the compiled core unless ``PUSHUP_PURE=1``). ``--profile`` prints the
cProfile table of the run with the sibling instead (run with ``PUSHUP_PURE=1``:
cProfile sees no Python frames inside the compiled core). It measures our
Python, not the kernel's share of a frame; docs/benchmarks.md (issue 17,
sessions 3 and 4) quotes it.
"""

from __future__ import annotations

import argparse
import cProfile
import heapq
import itertools
import pstats
import sys
import time
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.base import DelayedCall
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from pushup.config import Config
from pushup.ops.node import Node
from tests.backplane.mesh.pipe import Pipe

SECRET = "s" * 32
PER_TURN = 3
CONNECTIONS = 8


class HeapClock(Clock):
    """``task.Clock`` whose delayed calls sit in a heap: its own keeps a list
    it sorts on every call, which would be most of what this measures."""

    def __init__(self) -> None:
        super().__init__()
        self._heap: list[tuple[float, int, DelayedCall]] = []
        self._order = itertools.count()

    def callLater(self, delay: float, f: Any, *a: Any, **kw: Any) -> DelayedCall:
        call = DelayedCall(self.seconds() + delay, f, a, kw, lambda c: None, lambda c: None,
                           seconds=self.seconds)
        heapq.heappush(self._heap, (call.time, next(self._order), call))
        return call

    def advance(self, amount: float) -> None:
        self.rightNow += amount
        while self._heap and self._heap[0][0] <= self.rightNow:
            _, _, call = heapq.heappop(self._heap)
            if not (call.cancelled or call.called):
                call.called = 1
                call.func(*call.args, **call.kw)

    def getDelayedCalls(self) -> list[DelayedCall]:
        return [c for _, _, c in self._heap if not (c.cancelled or c.called)]


def _request(i: int) -> bytes:
    body = b'{"channels":["c%d"],"data":{"n":1,"text":"hello world"}}' % (i % 8)
    return (b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def run(clock: HeapClock, sibling: bool, publishes: int,
        per_turn: int = PER_TURN) -> tuple[float, float]:
    """(µs of CPU per publish on node A, µs per message delivering to B and back)."""
    node = Node(Config(node_id="a", cluster_secret=SECRET), reactor=clock,
                siblings=["http+unix://b"] if sibling else [])
    pipe = None
    if sibling:
        # another node id, as a sibling worker has: a node refuses batches of its own origin
        other = Node(Config(node_id="b", cluster_secret=SECRET), reactor=clock).mesh
        assert other is not None and node.mesh is not None
        other.ready = node.mesh.ready = True
        pipe = Pipe(other, unix=True, kernel=True)
        [link] = node.mesh.links
        link.dial, link.http = pipe.dial, pipe
        link.start()
        clock.advance(0)
        pipe.deliver()
        assert link.state == "up"
    connections = []
    for i in range(CONNECTIONS):
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5000 + i))
        protocol = node.front.buildProtocol(transport.getPeer())
        protocol.makeConnection(transport)  # type: ignore[union-attr]
        connections.append((protocol, transport))
    requests = [_request(i) for i in range(CONNECTIONS)]
    delivering = 0.0
    sent = 0
    start = time.process_time()
    for _ in range(publishes // per_turn):
        for _ in range(per_turn):
            protocol, _transport = connections[sent % CONNECTIONS]
            protocol.dataReceived(requests[sent % CONNECTIONS])  # type: ignore[attr-defined]
            sent += 1
        clock.advance(0)  # the turn ends: the batch leaves, the 201s go out
        if pipe is not None:
            t0 = time.process_time()
            pipe.deliver()
            clock.advance(0)
            delivering += time.process_time() - t0
    total = time.process_time() - start
    answered = sum(t.value().count(b"HTTP/1.1 201") for _, t in connections)
    assert answered == sent, f"{answered} of {sent} publishes answered 201"
    return 1e6 * (total - delivering) / sent, 1e6 * delivering / sent


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m loadtest.bench.replication")
    ap.add_argument("publishes", nargs="?", type=int, default=30_000)
    ap.add_argument("--per-turn", type=int, default=PER_TURN,
                    help="publishes a reactor turn, so messages a batch (default 3)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    clock = HeapClock()
    clock.advance(1_763_800_000.0)
    if args.profile:
        profile = cProfile.Profile(time.process_time)
        profile.enable()
        run(clock, True, args.publishes, args.per_turn)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        return
    alone = min(run(clock, False, args.publishes, args.per_turn)[0] for _ in range(3))
    both = [run(clock, True, args.publishes, args.per_turn) for _ in range(3)]
    with_sibling = min(b[0] for b in both)
    delivering = min(b[1] for b in both)
    print(f"node A alone: {alone:.1f} µs per publish; with a sibling: {with_sibling:.1f} µs "
          f"(+{with_sibling - alone:.1f}); the sibling's apply and its answers: "
          f"{delivering:.1f} µs per message (best of 3, {args.publishes} publishes, "
          f"{args.per_turn} a turn)")


if __name__ == "__main__":
    main(sys.argv[1:])
