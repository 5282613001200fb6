"""What every cluster must do with a Durable Stream, whatever carries it (Redis,
the mesh): each check takes the nodes' base URLs and asserts what a client relies
on. tests/cluster/test_streams_redis.py and test_streams_mesh.py run them.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from tests.cluster.clients import request


def stream_url(base: str, path: str) -> str:
    return f"{base}/v1/stream/{path}"


def create(base: str, path: str) -> str:
    """A text stream at ``path``, made through ``base``; its tail."""
    status, headers, _ = request("PUT", stream_url(base, path), b"",
                                 {"Content-Type": "text/plain"})
    assert status == 201, status
    return headers["stream-next-offset"]


def append(base: str, path: str, body: bytes) -> str:
    status, headers, _ = request("POST", stream_url(base, path), body,
                                 {"Content-Type": "text/plain"})
    assert status == 204, status
    return headers["stream-next-offset"]


def check_reads_alike_through_every_node(bases: Sequence[str], path: str) -> None:
    """Appends through each node in turn: every node reads them all, in
    order, names the same tail, and resumes from an offset another issued."""
    create(bases[0], path)
    issued = [append(bases[i % len(bases)], path, b"part%d;" % i) for i in range(6)]
    assert issued == sorted(issued) and len(set(issued)) == 6
    for base in bases:
        status, headers, body = request("GET", stream_url(base, path) + "?offset=-1")
        assert (status, body) == (200, b"".join(b"part%d;" % i for i in range(6)))
        assert headers["stream-next-offset"] == issued[-1]
        status, headers, _ = request("HEAD", stream_url(base, path))
        assert headers["stream-next-offset"] == issued[-1]
    # an offset the first node issued resumes on the last: what came after it, nothing else
    status, _, body = request("GET", stream_url(bases[-1], path) + f"?offset={issued[2]}")
    assert (status, body) == (200, b"part3;part4;part5;")


def check_long_poll_is_answered_by_an_append_through_another_node(
        reader: str, writer: str, path: str) -> None:
    tail = create(writer, path)
    answer: list[tuple[int, dict[str, str], bytes]] = []
    # timeout=30: only the append can answer it within the test's time
    poll = threading.Thread(target=lambda: answer.append(request(
        "GET", stream_url(reader, path) + f"?offset={tail}&live=long-poll&timeout=30",
        timeout=40)))
    poll.start()
    status, headers, body = request("GET", stream_url(reader, path) + f"?offset={tail}")
    assert (status, body) == (200, b"")  # the reader's node serves the stream
    after = append(writer, path, b"hello")
    poll.join(40)
    assert [(s, h["stream-next-offset"], b) for s, h, b in answer] == [(200, after, b"hello")]


def appends_until_killed(writer: str, path: str, kill: Callable[[], None],
                         ) -> tuple[list[tuple[bytes, str]], list[bytes]]:
    """Appends through ``writer``, one after another, until ``kill()`` (called
    once 200 are acknowledged) stops them: (each acknowledged append and its
    offset, every append sent)."""
    acked: list[tuple[bytes, str]] = []
    sent: list[bytes] = []
    enough = threading.Event()

    def write() -> None:
        for i in range(100_000):
            sent.append(b"%06d," % i)
            try:
                acked.append((sent[-1], append(writer, path, sent[-1])))
            except (OSError, AssertionError):
                return  # the node is gone: this append was never acknowledged
            if i == 200:
                enough.set()

    thread = threading.Thread(target=write)
    thread.start()
    assert enough.wait(60), "no 200 appends acknowledged within 60 s"
    kill()
    thread.join(30)
    assert not thread.is_alive()
    return acked, sent


def check_every_acknowledged_append_kept(reader: str, path: str,
                                         acked: list[tuple[bytes, str]],
                                         sent: list[bytes]) -> None:
    status, _, body = request("GET", stream_url(reader, path) + "?offset=-1")
    assert status == 200
    kept = b"".join(part for part, _ in acked)
    # every acknowledged append, in order; nothing that was not sent
    assert body.startswith(kept)
    assert b"".join(sent).startswith(body)
    # each at the offset it was acknowledged with, which the reader resumes from
    assert [offset for _, offset in acked] == [
        f"{i + 1:016d}_{7 * (i + 1):016d}" for i in range(len(acked))]
    status, _, rest = request("GET", stream_url(reader, path) + f"?offset={acked[-1][1]}")
    assert (status, rest) == (200, body[len(kept):])
