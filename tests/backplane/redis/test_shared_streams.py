"""Durable Streams shared through Redis (pushup/backplane/redis/streams.py), two
nodes' caches in one process on the real reactor and a real redis-server: what
one node writes wakes the long polls another holds, whenever it hears of it."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import pytest
from twisted.logger import formatEvent, globalLogPublisher

from deploy.redis_server import RedisServer
from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.stream_keys import channel_of, prefix_of
from pushup.backplane.redis.streams import SharedStreams
from pushup.config import parse_seeds
from pushup.core import streams as core_streams
from pushup.core.errors import PushUpError
from pushup.core.stream_values import START, Append, Creation
from pushup.core.streams import Streams
from tests.real_reactor import reactor, run_until, wait_for

uids = (f"{n:016x}" for n in itertools.count(1))


def now() -> int:
    return int(time.time() * 1000)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """The test's redis-server (its directory kept for a restart from a snapshot)."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def nodes(server: RedisServer) -> Iterator[Callable[[], tuple[SharedStreams, Streams]]]:
    """``node()``: one node's shared streams (its own Shards) on one redis-server."""
    made: list[Shards] = []

    def node() -> tuple[SharedStreams, Streams]:
        shards = Shards(parse_seeds(server.url), reactor)
        made.append(shards)
        shards.start()
        run_until(lambda: shards.connected, 5.0, "Shards to connect")
        streams = Streams(lambda: next(uids), 1 << 20)
        return SharedStreams(shards, streams, now, 2.0, reactor), streams

    yield node
    for shards in made:
        wait_for(shards.stop())


def test_a_write_heard_while_a_request_is_decided_wakes_the_poll_it_then_holds(nodes) -> None:
    """Node A reads the stream, then (its request not yet decided) hears of B's
    append; the request goes on to hold a long poll on what it read before. That
    poll must be woken: A reads the stream again once the request is done."""
    a, a_streams = nodes()
    b, b_streams = nodes()
    created = Creation("text/plain", None, None, False, b"")
    wait_for(b.serve(["p"], lambda: b_streams.create("p", created, now())))
    heard: list[str] = []
    refresh = a.written
    a.written = lambda path, gone: (  # type: ignore[method-assign]
        heard.append(path), refresh(path, gone))
    stream = wait_for(a.serve(["p"], lambda: a_streams.at("p")))
    run_until(lambda: heard == ["p"], 5.0, "A's subscription to the stream")  # synced

    wait_for(a.lock.acquire())  # a request of A, between its read and its decision
    wait_for(b.serve(["p"], lambda: b_streams.append("p", Append(None, b"new", False), now())))
    run_until(lambda: heard == ["p", "p"], 5.0, "A to hear of B's append")
    woken: list[bytes] = []
    stream.wait(lambda: woken.append(bytes(stream.entries[-1].data)))
    a.lock.release()  # the request decided: it holds a poll
    run_until(lambda: woken == [b"new"], 5.0, "the poll to be woken")


def ask(node: SharedStreams, path: str, run: Callable[[], object], *also: str) -> object:
    """``run()``'s outcome through ``node`` (a request to ``path``, and to
    ``also``: a fork's source)."""
    return wait_for(node.serve([path, *also], run), 10.0)


def text(streams: Streams, path: str) -> bytes:
    stream = streams.at(path)
    assert stream is not None
    return stream.read(START, 1 << 20).data


def until_redis_answers(node: SharedStreams, streams: Streams, path: str) -> None:
    """A read of ``path`` through ``node`` once its Shards are connected again."""
    for _ in range(200):  # bounded: ~10 s of reconnection
        try:
            ask(node, path, lambda: streams.at(path))
            return
        except PushUpError:
            reactor.iterate(0.05)
    raise AssertionError("Redis did not answer again")


@pytest.fixture
def lines() -> Iterator[list[str]]:
    """Every log line written meanwhile."""
    seen: list[str] = []

    def observe(event: dict[str, object]) -> None:
        seen.append(formatEvent(event))

    globalLogPublisher.addObserver(observe)
    yield seen
    globalLogPublisher.removeObserver(observe)


def test_a_node_whose_appends_redis_lost_serves_redis_bytes_and_reissues_none_of_its_offsets(
        nodes, server, lines) -> None:
    """Redis restarts from a snapshot older than three of A's appends; B appends
    two others, of other sizes. A must serve what Redis holds (as B does), say
    so once, and no append after may end at an offset A issued for a lost one."""
    a, a_streams = nodes()
    b, b_streams = nodes()
    ask(a, "p", lambda: a_streams.create("p", Creation("text/plain", None, None, False, b""),
                                         now()))
    for i in range(5):
        ask(a, "p", lambda i=i: a_streams.append("p", Append(None, b"e%d|" % i, False), now()))
    server.cli("SAVE")
    lost = [ask(a, "p", lambda i=i: a_streams.append(
        "p", Append(None, b"e%d|" % i, False), now())).tail for i in range(5, 8)]
    server.kill()
    server.restart()
    until_redis_answers(b, b_streams, "p")
    for name in (b"XX0|", b"XX1|"):
        ask(b, "p", lambda name=name: b_streams.append("p", Append(None, name, False), now()))
    until_redis_answers(a, a_streams, "p")

    held = b"e0|e1|e2|e3|e4|XX0|XX1|"
    assert text(a_streams, "p") == held
    assert text(b_streams, "p") == held
    after = ask(a, "p", lambda: a_streams.append("p", Append(None, b"Y0|", False), now()))
    ask(b, "p", lambda: b_streams.at("p"))
    assert text(a_streams, "p") == text(b_streams, "p") == held + b"Y0|"
    y0 = a_streams.at("p").entries[-1]  # type: ignore[union-attr]
    assert all(y0.begins.appends >= p.appends and y0.begins.size >= p.size for p in lost)
    assert after.tail == b_streams.at("p").tail  # type: ignore[union-attr]
    ask(a, "p", lambda: a_streams.at("p"))
    assert len([line for line in lines if "lost appends" in line]) == 1, lines


def test_a_stream_deleted_through_another_node_is_forgotten_with_its_subscription(
        nodes, server) -> None:
    """B appends to and reads streams A created; A deletes them: B holds none
    of them (nor their forks' sources), and follows no channel of theirs."""
    a, a_streams = nodes()
    b, b_streams = nodes()
    plain = Creation("text/plain", None, None, False, b"x")
    paths = [f"s{i}" for i in range(20)]
    for path in paths:
        ask(a, path, lambda path=path: a_streams.create(path, plain, now()))
        ask(b, path, lambda path=path: b_streams.append(path, Append(None, b"y", False), now()))
    fork = Creation(None, None, None, False, b"", "s0")
    ask(a, "f", lambda: a_streams.create("f", fork, now()), "s0")
    ask(b, "f", lambda: b_streams.at("f"))
    assert len(b.followed) == 21
    for path in ["f", *paths]:
        ask(a, path, lambda path=path: a_streams.delete(path, now()))
    run_until(lambda: not b.followed and not b.by_uid, 5.0,
              f"B to forget the deleted streams ({len(b.followed)} followed, "
              f"{len(b.by_uid)} held)")
    assert (len(b_streams), b.versions, b.homes, b.sources, b.at) == (0, {}, {}, {}, {})
    run_until(lambda: server.cli("PUBSUB", "SHARDNUMSUB", *[
        ch for p in ["f", *paths] for ch in [channel_of(p, prefix_of(p))]])[1::2] == [0] * 21,
        5.0, "B to leave the streams' channels")


def test_a_fork_chain_deeper_than_a_hundred_is_written_and_read_through_two_nodes(
        nodes, monkeypatch) -> None:
    """Each fork of the one before, 150 deep, created through A: B appends to
    the deepest and reads it whole; A reads it too (no recursion per level).
    New forks stop at ``MAX_FORK_DEPTH``; a chain from before that bound may
    be deeper, so the bound is lifted here to make one."""
    monkeypatch.setattr(core_streams, "MAX_FORK_DEPTH", 1000)
    a, a_streams = nodes()
    b, b_streams = nodes()
    ask(a, "c0", lambda: a_streams.create("c0", Creation("text/plain", None, None, False,
                                                         b"root|"), now()))
    depth = 150
    for level in range(1, depth + 1):
        made = ask(a, f"c{level}", lambda level=level: a_streams.create(
            f"c{level}", Creation(None, None, None, False, b"", f"c{level - 1}"), now()),
            f"c{level - 1}")
        assert made[1] is True  # type: ignore[index]
    ask(b, f"c{depth}", lambda: b_streams.append(f"c{depth}", Append(None, b"leaf|", False),
                                                 now()))
    ask(a, f"c{depth}", lambda: a_streams.at(f"c{depth}"))
    assert text(b_streams, f"c{depth}") == text(a_streams, f"c{depth}") == b"root|leaf|"


def test_a_stream_created_again_after_redis_restarted_empty_goes_on_past_the_lost_ones(
        nodes, server, lines) -> None:
    """A served three appends; Redis restarts empty and B creates the stream
    again with one. A then serves B's stream, and its next append starts past
    the offsets A issued for the lost stream (none is ever named again)."""
    a, a_streams = nodes()
    b, b_streams = nodes()
    plain = Creation("text/plain", None, None, False, b"")
    ask(a, "p", lambda: a_streams.create("p", plain, now()))
    lost = [ask(a, "p", lambda i=i: a_streams.append(
        "p", Append(None, b"old%d|" % i, False), now())).tail for i in range(3)]
    server.kill()
    server.restart()  # no snapshot: empty
    for _ in range(200):  # bounded: ~10 s of reconnection
        try:
            ask(b, "p", lambda: b_streams.create(
                "p", Creation("text/plain", None, None, False, b"new|"), now()))
            break
        except PushUpError:
            reactor.iterate(0.05)
    until_redis_answers(a, a_streams, "p")
    assert text(a_streams, "p") == b"new|"
    ask(a, "p", lambda: a_streams.append("p", Append(None, b"next|", False), now()))
    ask(b, "p", lambda: b_streams.at("p"))
    assert text(a_streams, "p") == text(b_streams, "p") == b"new|next|"
    after = b_streams.at("p").entries[-1].begins  # type: ignore[union-attr]
    assert all(after.appends >= p.appends and after.size >= p.size for p in lost)
    assert len([line for line in lines if "Redis lost stream" in line]) == 1, lines


def test_what_one_nodes_retention_let_go_of_another_node_lets_go_of_and_never_misreads(
        nodes) -> None:
    """A's appends past B's stream's retention let the oldest go in Redis; B
    reads the same earliest offset, holds only what is kept, and its cache's
    count of Redis's appends stays right as both write (no append read twice,
    none taken for lost)."""
    a, a_streams = nodes()
    b, b_streams = nodes()
    kept = Creation("text/plain", None, None, False, b"", None, None, 0, None, 20)
    wait_for(a.serve(["r"], lambda: a_streams.create("r", kept, now())))
    for i in range(6):
        node, streams = (a, a_streams) if i % 2 else (b, b_streams)
        wait_for(node.serve(["r"], lambda s=streams, i=i: s.append(
            "r", Append(None, b"%09d;" % i, False), now())))
    stream_a = wait_for(a.serve(["r"], lambda: a_streams.get("r", now())))
    stream_b = wait_for(b.serve(["r"], lambda: b_streams.get("r", now())))
    assert stream_a.earliest == stream_b.earliest == stream_b.entries[0].begins
    assert stream_b.read(START, 1 << 20).data == b"000000004;000000005;"
    assert stream_a.read(START, 1 << 20).data == b"000000004;000000005;"
    assert len(stream_b.entries) + stream_b.dropped == 6 == len(stream_a.entries) + stream_a.dropped
