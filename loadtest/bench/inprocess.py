"""`python -m loadtest.bench.inprocess [N] [ROUNDS] [--gc] [--profile]`: one delivery plus
its re-poll, in process, on a real ``Node`` (a ``task.Clock``, string transports,
no sockets, no reactor). `... --publish [N] [--gc] [--profile]`: keep-alive publishes instead.
`--presence`: the node runs with ``--presence``; `--members`: each client names a
``client`` and a ``user`` of its own (so no two re-polls share a query string).

N held polls on one channel; each round one publish answers them all and each
client re-polls with its new cursor (held again). Prints the process CPU time
per delivery + re-poll (best of 5 rounds of ROUNDS), or with ``--profile`` the
cProfile table of the hot functions (run with ``PUSHUP_PURE=1``: cProfile sees
no Python frames inside the compiled core). Issue 18's figures in
docs/benchmarks.md came from it; it measures our Python, not the reactor or the
system calls.

``--publish``: N keep-alive publishes (default 20,000) by 8 publishers, each on
its own connection and channel, with no subscriber (as the socket bench's 8
publishers): each reactor turn (``clock.advance(0)``: what the publishes
scheduled runs) follows one publish per connection, as a real turn reads one
request from each of 8 ready publishers (``strace -c`` of the socket bench: one
``epoll_wait`` per ~8 publishes). Prints the process CPU per publish, the
median of 7 runs, and checks that the answers are 201s. Issue 29's figures came
from it.
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
PUBLISHERS = 8  # --publish: keep-alive connections, one publish each per reactor turn


def poll(cursor: str, who: str = "") -> bytes:
    return (f"GET /subscribe?channels=c&since={cursor}&timeout=50{who} HTTP/1.1\r\n"
            f"Host: x\r\n\r\n").encode()


def publishing(argv: list[str]) -> None:
    """N keep-alive publishes, each answered 201 (see the module docstring)."""
    numbers = [int(a) for a in argv if a.isdigit()]
    n = numbers[0] if numbers else 20_000
    clock = Clock()
    clock.advance(1_763_800_000.0)
    node = Node(Config(), reactor=clock)
    publishers = []
    for i in range(PUBLISHERS):
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 39990 + i))
        protocol = node.front.buildProtocol(transport.getPeer())
        protocol.makeConnection(transport)  # type: ignore[union-attr]
        body = json.dumps({"channels": [f"bench-pub-{i}"],
                           "data": {"bench": "publish", "w": i}}).encode()
        request = (b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        publishers.append((transport, protocol.dataReceived, request))  # type: ignore[union-attr]

    def run(times: int) -> None:
        advance = clock.advance
        for turn in range(times // PUBLISHERS):
            for _, receive, request in publishers:
                receive(request)
            advance(0)
            if turn & 7 == 7:
                for transport, _, _ in publishers:
                    transport.clear()

    run(2000)  # the store's caches reach their steady state
    for transport, _, _ in publishers:
        transport.clear()
    before = node.service.counters.published
    run(PUBLISHERS)
    for transport, _, _ in publishers:
        assert transport.value().startswith(b"HTTP/1.1 201 "), transport.value()[:200]
    assert node.service.counters.published == before + PUBLISHERS
    if "--gc" in argv:
        from pushup.ops.cli import tune_gc

        tune_gc()
    if "--profile" in argv:
        profile = cProfile.Profile()
        profile.enable()
        run(n)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        return
    took = []
    for _ in range(7):
        start = time.process_time()
        run(n)
        took.append(time.process_time() - start)
    took.sort()
    build = getattr(pushup, "BUILD", "interpreted")
    print(f"{build}{' + gc tuned' if '--gc' in argv else ''}: {n} keep-alive publishes: "
          f"{took[3] / n * 1e6:.2f} µs CPU per publish (median of 7; "
          f"{took[0] / n * 1e6:.2f}-{took[-1] / n * 1e6:.2f})")


def main(argv: list[str]) -> None:
    if "--publish" in argv:
        publishing(argv)
        return
    numbers = [int(a) for a in argv if a.isdigit()]
    n, rounds = (numbers + [2000, 10][len(numbers):])[:2]
    clock = Clock()
    clock.advance(1_763_800_000.0)
    # --presence: the node counts who subscribes; --members: each client is a user
    # with a client id of its own (as the JS client's presence polls are), so no
    # two re-polls are alike
    node = Node(Config(presence="--presence" in argv), reactor=clock)
    members = "--members" in argv

    def who(i: int) -> str:
        return f"&client=c{i}&user=u{i}" if members else ""

    def connect(port: int) -> tuple[StringTransport, object]:
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", port))
        protocol = node.front.buildProtocol(transport.getPeer())
        protocol.makeConnection(transport)  # type: ignore[union-attr]
        return transport, protocol

    clients = [connect(40000 + i % 20000) for i in range(n)]
    publisher_t, publisher = connect(39999)
    publish = (b"POST /publish HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(PUBLISH_BODY)) + PUBLISH_BODY
    first = node.service.store.end().encode()
    for i, (_, protocol) in enumerate(clients):
        protocol.dataReceived(poll(first, who(i)))  # type: ignore[attr-defined]
    clock.advance(0)

    def run(times: int) -> None:
        for _ in range(times):
            publisher.dataReceived(publish)  # type: ignore[attr-defined]
            publisher_t.clear()
            clock.advance(0)
            clock.advance(0)
            answer = json.loads(clients[0][0].value().split(b"\r\n\r\n", 1)[1])
            cursor = answer["cursor"]
            again = poll(cursor)
            for i, (transport, protocol) in enumerate(clients):
                transport.clear()
                protocol.dataReceived(poll(cursor, who(i)) if members else again)  # type: ignore[attr-defined]
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
