"""pushup/http/stream_polls.py: a held stream long poll leaves nothing behind.

What the front relies on: a poll whose client leaves is forgotten at once, its
connection freed whatever other polls of its group are still held (issue 35,
item 6: it stayed in its group, +2,130 bytes each); and a poll answered (by its
timeout, an append, or its client leaving) frees its group by reference
counting alone (item 7: a group and its wake-up were a cycle, ~570 bytes a
poll left for a full collection that a serving node almost never runs:
``cli.tune_gc``). So these tests run with the collector off and count what is
alive, on the in-memory node and ``task.Clock``.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from pushup.http.exchange import Held, Response
from pushup.http.handlers import Handlers
from pushup.http.stream_polls import Group
from tests.http.test_streams import answered, ask, node

POLLS = 200


class Client:
    """A held poll's connection, as the front's: it lets go of its ``Held``
    once answered (``HTTPProtocol.answer_held`` clears ``_waiting``)."""

    def __init__(self) -> None:
        self.answers: list[Response] = []
        self.held: Held | None = None

    def answer_held(self, response: Response) -> bool:
        self.answers.append(response)
        self.held = None
        return True

    def leave(self) -> None:
        """The connection is lost: what the front does (``Held.cancel``)."""
        held, self.held = self.held, None
        assert held is not None
        held.cancel()


def alive(kind: type) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is kind)


def hold(handlers: Handlers, path: bytes, offset: bytes = b"-1", cursor: int = 0,
         timeout: int = 60) -> Client:
    client = Client()
    held = ask(handlers, b"GET", b"%s?offset=%s&live=long-poll&cursor=%d&timeout=%d"
               % (path, offset, cursor, timeout), client=client)  # type: ignore[arg-type]
    assert isinstance(held, Held) and client.answers == []
    client.held = held
    return client


def test_a_poll_whose_client_left_is_freed_at_once_while_its_group_is_held(no_collector):
    handlers = node()
    answered(ask(handlers, b"PUT", b"/v1/stream/s", content_type=b"text/plain"))
    staying = hold(handlers, b"/v1/stream/s", timeout=30)  # its deadline first: the heap's top
    leaving = [hold(handlers, b"/v1/stream/s") for _ in range(POLLS)]
    gone = [weakref.ref(client) for client in leaving]
    for client in leaving:
        client.leave()
    del leaving, client
    assert sum(1 for ref in gone if ref() is not None) == 0  # every connection freed
    groups = list(handlers.streams.polls._groups.values())
    assert [len(group.polls) for group in groups] == [1]
    assert handlers.streams.long_polls == 1
    answered(ask(handlers, b"POST", b"/v1/stream/s", b"x", content_type=b"text/plain"))
    assert [(r.status, r.body) for r in staying.answers] == [(200, b"x")]


@pytest.mark.parametrize("ending", ["timeout", "append", "leave"])
def test_a_poll_alone_at_its_offset_leaves_no_group_behind(no_collector, ending):
    handlers = node()
    streams = [b"/v1/stream/q%d" % i for i in range(20)]
    for path in streams:
        answered(ask(handlers, b"PUT", b"%s" % path, content_type=b"text/plain"))
    before = alive(Group)
    for round_ in range(15):  # keep-alive followers of quiet streams, a new cursor each time
        for path in streams:
            stream = handlers.streams.streams.at(path.decode())
            assert stream is not None
            client = hold(handlers, path, stream.tail.offset.encode(), round_, timeout=3)
            if ending == "append":
                answered(ask(handlers, b"POST", path, b"x", content_type=b"text/plain"))
            elif ending == "leave":
                client.leave()
        handlers.service.clock.advance(3)
    polls = handlers.streams.polls
    assert (len(polls._groups), polls.held) == (0, 0)
    assert all(not handlers.streams.streams.at(p.decode()).waiters  # type: ignore[union-attr]
               for p in streams)
    assert alive(Group) - before == 0
