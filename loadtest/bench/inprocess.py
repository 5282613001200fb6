"""`python -m loadtest.bench.inprocess [N] [ROUNDS] [--gc] [--profile]`: one delivery plus
its re-poll, in process, on a real ``Node`` (a ``task.Clock``, string transports,
no sockets, no reactor).

N held polls on one channel; each round one publish answers them all and each
client re-polls with its new cursor (held again). Prints the process CPU time
per delivery + re-poll (best of 5 rounds of ROUNDS), or with ``--profile`` the
cProfile table of the hot functions (run with ``PUSHUP_PURE=1``: cProfile sees
no Python frames inside the compiled core). Issue 18's figures in
docs/benchmarks.md came from it; it measures our Python, not the reactor or the
system calls.
"""

from __future__ import annotations

import cProfile
import json
import pstats
import sys
import time

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

import pushup
from pushup.config import Config
from pushup.ops.node import Node

PUBLISH_BODY = b'{"channels":["c"],"data":{"n":1}}'


def poll(cursor: str) -> bytes:
    return (f"GET /subscribe?channels=c&since={cursor}&timeout=50 HTTP/1.1\r\n"
            f"Host: x\r\n\r\n").encode()


def main(argv: list[str]) -> None:
    numbers = [int(a) for a in argv if a.isdigit()]
    n, rounds = (numbers + [2000, 10][len(numbers):])[:2]
    clock = Clock()
    clock.advance(1_763_800_000.0)
    node = Node(Config(), reactor=clock)

    def connect(port: int) -> tuple[StringTransport, object]:
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", port))
        protocol = node.front.buildProtocol(transport.getPeer())
        protocol.makeConnection(transport)  # type: ignore[union-attr]
        return transport, protocol

    clients = [connect(40000 + i % 20000) for i in range(n)]
    publisher_t, publisher = connect(39999)
    publish = (b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(PUBLISH_BODY)) + PUBLISH_BODY
    first = poll(node.service.store.end().encode())
    for _, protocol in clients:
        protocol.dataReceived(first)  # type: ignore[attr-defined]
    clock.advance(0)

    def run(times: int) -> None:
        for _ in range(times):
            publisher.dataReceived(publish)  # type: ignore[attr-defined]
            publisher_t.clear()
            clock.advance(0)
            clock.advance(0)
            answer = json.loads(clients[0][0].value().split(b"\r\n\r\n", 1)[1])
            again = poll(answer["cursor"])
            for transport, protocol in clients:
                transport.clear()
                protocol.dataReceived(again)  # type: ignore[attr-defined]
            clock.advance(0)

    run(3)
    assert len(node.service.hub) == n, "every client is held again after each round"
    if "--gc" in argv:  # as `pushup serve` does once listening (issue 18)
        from pushup.ops.cli import tune_gc

        tune_gc()
    if "--profile" in argv:
        profile = cProfile.Profile()
        profile.enable()
        run(rounds)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        run(rounds)
        best = min(best, time.process_time() - start)
    build = getattr(pushup, "BUILD", "interpreted")  # older checkouts: no compiled core
    print(f"{build}{' + gc tuned' if '--gc' in argv else ''}: {n} held, {rounds} rounds: "
          f"{best / rounds / n * 1e6:.2f} µs CPU per delivery + re-poll (best of 5)")


if __name__ == "__main__":
    main(sys.argv[1:])
