"""Between the workers of one node, a 201 counts what a sibling's Unix socket
holds (README, "What a 201 means"): the frame that carried the messages is
wholly in the socket, on a connection on which the sibling has acked a batch.
Not a TCP peer's socket, not a frame the socket took only in part, not before
the sibling's first ack on the connection.

And the receiving end answers the batches of one read in one write."""

from __future__ import annotations

from twisted.internet.task import Clock

from pushup.backplane import Unconfirmed
from pushup.backplane.mesh.mesh import Mesh
from pushup.backplane.mesh.outbound import SIBLING_WINDOW
from pushup.config import Config
from pushup.core.model import Draft
from pushup.core.service import Service
from tests.backplane.mesh.pipe import Pipe, frames
from tests.backplane.mesh.test_replication import _clock, _cluster, _held, _store


def _worker(clock: Clock, url: str = "http+unix://c", takes: int | None = None):
    """Worker ``b`` and its one peer ``c`` (a sibling at ``http+unix://``, else
    another node), linked and past a first batch ``c`` has acked."""
    sibling = url.startswith("http+unix://")
    config = Config(cluster_secret="s", peer=() if sibling else (url,))
    b = Mesh(Service(_store("b"), clock, 120), config, clock, http=None,
                siblings=(url,) if sibling else ())
    c = _cluster(clock, name="c")
    pipe = Pipe(c, unix=sibling, kernel=True, takes=takes)
    [link] = b.links
    link.dial, link.http = pipe.dial, pipe
    b.ready = True
    link.start()
    clock.advance(0)
    pipe.deliver()  # the handshake and the hello, acked
    assert link.state == "up"
    return b, c, pipe


def _publish(b: Mesh, text: bytes) -> list:
    answered: list = []
    b.publish([Draft(("x",), text)]).addCallback(answered.append)
    return answered


def test_a_publish_is_answered_once_the_siblings_socket_holds_it():
    clock = _clock()
    b, c, pipe = _worker(clock)
    answered = _publish(b, b"1")
    assert len(answered) == 1 and not isinstance(answered[0], Unconfirmed)
    assert len(pipe.held) == 1 and c.store.message_count == 0  # not read yet
    pipe.deliver()
    assert _held(c.store) == [b"1"]


def test_the_first_publish_on_a_connection_waits_for_the_siblings_ack():
    """Until the sibling has acked a batch on this connection, it may still
    be catching up (it would refuse the batch): its socket does not count."""
    clock = _clock()
    b = Mesh(Service(_store("b"), clock, 120), Config(cluster_secret="s"), clock,
                http=None, siblings=("http+unix://c",))
    c = _cluster(clock, name="c")
    pipe = Pipe(c, unix=True, kernel=True)
    [link] = b.links
    link.dial, link.http = pipe.dial, pipe
    b.ready = True
    link.start()
    clock.advance(0)
    answered = _publish(b, b"1")
    assert answered == []
    pipe.deliver()
    assert len(answered) == 1 and not isinstance(answered[0], Unconfirmed)
    second = _publish(b, b"2")
    assert len(second) == 1 and c.store.message_count == 1


def test_a_tcp_peers_socket_does_not_count():
    """Bytes in a TCP socket may never leave the machine: only an ack counts."""
    clock = _clock()
    b, c, pipe = _worker(clock, url="http://c")
    answered = _publish(b, b"1")
    assert answered == []
    pipe.deliver()
    assert len(answered) == 1 and not isinstance(answered[0], Unconfirmed)


def test_a_frame_the_socket_took_in_part_waits_for_the_ack():
    clock = _clock()
    b, c, pipe = _worker(clock, takes=10)
    answered = _publish(b, b"1")
    assert answered == []
    pipe.deliver()
    assert len(answered) == 1 and _held(c.store) == [b"1"]


def test_the_batches_of_one_read_are_answered_in_one_write():
    clock = _clock()
    b, c, pipe = _worker(clock, url="http://c")
    b.links[0].outbound.cork = 0  # each turn's batch leaves with others in flight
    for text in (b"1", b"2", b"3"):
        _publish(b, text)
        clock.advance(0)  # each turn's flush: one batch each
    assert len(pipe.held) == 3
    writes: list[bytes] = []
    write = pipe.st.write
    pipe.st.write = lambda data: (writes.append(data), write(data))  # type: ignore[method-assign]
    pipe.deliver()
    assert [frames(w) for w in writes] == [[b"a1", b"a2", b"a3"]]


def test_a_sibling_that_reads_nothing_holds_a_window_of_answered_publishes():
    """Its socket holds up to SIBLING_WINDOW batches, each publish answered
    as its batch goes in; the next waits for the sibling's answers."""
    clock = _clock()
    b, c, pipe = _worker(clock)
    answered = []
    for n in range(SIBLING_WINDOW + 1):
        answered.append(_publish(b, b"%d" % n))
        clock.advance(0)  # each turn's batch goes in (the sibling answers none)
    assert all(len(a) == 1 for a in answered[:SIBLING_WINDOW]) and answered[-1] == []
    assert len(pipe.held) == SIBLING_WINDOW
    pipe.deliver()  # its answers make room: the last batch goes in at the turn's end
    clock.advance(0)
    assert len(answered[-1]) == 1
    pipe.deliver()
    assert c.store.message_count == SIBLING_WINDOW + 1


def test_a_sibling_restarted_empty_gets_everything_the_old_process_held_again():
    """A worker restarted while its sibling could not give it a snapshot (at
    ``--max-connections``) starts empty: the sibling's link resends what the
    old process held, though nothing new was published since."""
    clock = _clock()
    b, c, pipe = _worker(clock)
    for i in range(5):
        _publish(b, b"%d" % i)
    clock.advance(0)
    pipe.deliver()
    [link] = b.links
    assert link.holds == 5 and c.store.message_count == 5
    pipe.dead = True
    pipe.receiver = fresh = _cluster(clock, name="c")
    pipe.dead = False
    clock.advance(0)  # reconnect at once
    pipe.deliver()
    assert _held(fresh.store) == [b"%d" % i for i in range(5)]
    assert link.holds == 5 and link.settled and link.state == "up"
