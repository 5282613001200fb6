"""pushup/backplane/mesh/phases.py: where a peer connection is, at either end.

The two tables are read as the rules they state (every move listed, every
other raises, the handshake goes one way, a lost connection stays lost);
then the two real ends, a ``Dial`` and a ``PeerStream`` wired together by
hand over StringTransports, are seen to go through them; and a ``PeerLink``
driven through ``pipe.Pipe`` (acks, a cork, relays, a timeout, a dial given
up, a stop) changes its ``Dial`` only through the Dial's own methods.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from twisted.internet import defer
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from pushup.backplane.mesh import dial as dial_module
from pushup.backplane.mesh.dial import Dial, PeerRefused
from pushup.backplane.mesh.peers import PeerLink
from pushup.backplane.mesh.phases import (
    DIALLING_MOVES,
    RECEIVING_MOVES,
    DiallingEvent,
    DiallingPhase,
    ReceivingEvent,
    ReceivingPhase,
    dialling_after,
    receiving_after,
)

# (PeerStream through the pipe, which names the receiving end's module.)
from tests.backplane.mesh.pipe import SWITCHED, PeerStream, Pipe, frames
from tests.backplane.mesh.test_replication import (
    _clock,
    _cluster,
    _published,
    _store,
    _worker_with_sibling,
    frame,
)

R, RE = ReceivingPhase, ReceivingEvent
D, DE = DiallingPhase, DiallingEvent

# Every legal move, written out: the tables must say exactly this.
RECEIVING = {
    (R.HELLO, RE.HELLO): R.PROOF, (R.HELLO, RE.CLOSE): R.CLOSED, (R.HELLO, RE.LOST): R.CLOSED,
    (R.PROOF, RE.PROVEN): R.OPEN, (R.PROOF, RE.CLOSE): R.CLOSED, (R.PROOF, RE.LOST): R.CLOSED,
    (R.OPEN, RE.CLOSE): R.CLOSED, (R.OPEN, RE.LOST): R.CLOSED,
    (R.CLOSED, RE.LOST): R.CLOSED,
}
DIALLING = {
    (D.CONNECTING, DE.CONNECTED): D.ASKING, (D.CONNECTING, DE.LOST): D.CLOSED,
    (D.ASKING, DE.ANSWERED): D.PROVING, (D.ASKING, DE.LOST): D.CLOSED,
    (D.PROVING, DE.PROVEN): D.OPEN, (D.PROVING, DE.LOST): D.CLOSED,
    (D.OPEN, DE.ACKED): D.ANSWERING, (D.OPEN, DE.LOST): D.CLOSED,
    (D.ANSWERING, DE.ACKED): D.ANSWERING, (D.ANSWERING, DE.LOST): D.CLOSED,
}


def test_every_phase_has_its_row_and_every_move_lands_on_a_phase():
    assert set(RECEIVING_MOVES) == set(ReceivingPhase)
    assert set(DIALLING_MOVES) == set(DiallingPhase)
    for row in RECEIVING_MOVES.values():
        assert all(isinstance(to, ReceivingPhase) for to in row.values())
    for dialling_row in DIALLING_MOVES.values():
        assert all(isinstance(to, DiallingPhase) for to in dialling_row.values())


@pytest.mark.parametrize("end, phases, events, listed, after", [
    ("receiving", ReceivingPhase, ReceivingEvent, RECEIVING, receiving_after),
    ("dialling", DiallingPhase, DiallingEvent, DIALLING, dialling_after),
])
def test_each_end_makes_every_listed_move_and_no_other(end, phases, events, listed, after):
    for phase in phases:
        for event in events:
            if (phase, event) in listed:
                assert after(phase, event) is listed[phase, event]
            else:
                with pytest.raises(ValueError,
                                   match=f"{end}: no move from {phase.name} on {event.name}"):
                    after(phase, event)


def test_the_handshake_goes_one_way_and_a_lost_connection_stays_lost():
    order = list(ReceivingPhase)
    for (phase, _), to in RECEIVING.items():
        assert order.index(to) >= order.index(phase)
    for (phase, _), to in DIALLING.items():
        assert to.value >= phase.value
    assert {receiving_after(p, RE.LOST) for p in ReceivingPhase} == {R.CLOSED}
    assert {dialling_after(p, DE.LOST) for p in DiallingPhase if p is not D.CLOSED} == {D.CLOSED}
    assert DIALLING_MOVES[D.CLOSED] == {}  # lost once: the link dials a new connection
    # nothing is taken from a dialler before it proved itself, nor sent to a peer before it did
    assert [p for p in ReceivingPhase if RE.PROVEN in RECEIVING_MOVES[p]] == [R.PROOF]
    assert [p for p in DiallingPhase if DE.PROVEN in DIALLING_MOVES[p]] == [D.PROVING]


# -- the two real ends --------------------------------------------------------------


class _Link:
    """What a ``Dial`` tells its link, recorded."""

    url = "http://b"

    def __init__(self) -> None:
        self.told: list[tuple[str, Any]] = []

    def stream_opened(self, stream: Dial) -> None:
        self.told.append(("opened", None))

    def stream_frame(self, stream: Dial, frame: bytes) -> None:
        self.told.append(("frame", frame))

    def stream_failed(self, stream: Dial, why: Exception) -> None:
        self.told.append(("failed", why))

    def stream_lost(self, stream: Dial, reason: Any) -> None:
        self.told.append(("lost", None))


def _ends(secret: str = "s"):
    """A dialling end connected (its Upgrade read by nobody) and a receiving end."""
    clock = _clock()
    link, node = _Link(), _cluster(clock, secret=secret)
    node.ready = True
    dial, ct = Dial(link, "s", clock.seconds()), StringTransport()
    assert dial.phase is D.CONNECTING and not dial.open
    dial.makeConnection(ct)
    assert dial.phase is D.ASKING and ct.value().startswith(b"GET /peer/stream ")
    ct.clear()
    stream, st = PeerStream(node), StringTransport()
    stream.makeConnection(st)
    return clock, link, node, dial, ct, stream, st


def _cross(sender: StringTransport, receiver: Any) -> None:
    data = sender.value()
    sender.clear()
    receiver.dataReceived(data)


def test_both_ends_go_through_the_handshake_phase_by_phase_and_are_lost_once():
    clock, link, node, dial, ct, stream, st = _ends()
    assert stream.phase is R.HELLO
    dial.dataReceived(SWITCHED)
    assert dial.phase is D.PROVING and [f[:1] for f in frames(ct.value())] == [b"h"]
    _cross(ct, stream)
    assert stream.phase is R.PROOF and [f[:1] for f in frames(st.value())] == [b"c"]
    _cross(st, dial)
    assert dial.phase is D.OPEN and dial.open and not dial.answering
    assert link.told == [("opened", None)]
    _cross(ct, stream)
    assert stream.phase is R.OPEN and node.refused == 0
    dial.acked()
    assert dial.phase is D.ANSWERING and dial.open and dial.answering
    dial.acked()  # every ack after the first leaves it there
    assert dial.phase is D.ANSWERING
    st.write(frame(b"a0"))
    _cross(st, dial)
    assert link.told[-1] == ("frame", b"a0")  # open: every frame is the link's
    stream.connectionLost(Failure(ConnectionDone()))
    dial.connectionLost(Failure(ConnectionDone()))
    assert stream.phase is R.CLOSED and dial.phase is D.CLOSED
    assert link.told[-1] == ("lost", None)
    with pytest.raises(ValueError, match="dialling: no move from CLOSED on LOST"):
        dial.connectionLost(Failure(ConnectionDone()))


def test_the_receiving_end_closes_on_a_frame_out_of_turn_and_reads_nothing_more():
    clock, link, node, dial, ct, stream, st = _ends()
    stream.dataReceived(frame(b"p" + b"x" * 32))  # a proof before any hello
    assert stream.phase is R.CLOSED and node.refused == 1
    assert frames(st.value())[-1] == b"erefused" and st.disconnecting
    st.clear()
    stream.dataReceived(frame(b"h" + b"c" * 16))  # read into nothing
    assert stream.phase is R.CLOSED and node.refused == 1 and st.value() == b""
    stream.connectionLost(Failure(ConnectionDone()))
    assert stream.phase is R.CLOSED


def test_a_wrong_proof_closes_the_receiving_end_from_proof():
    clock, link, node, dial, ct, stream, st = _ends()
    stream.dataReceived(frame(b"h" + b"c" * 16))
    assert stream.phase is R.PROOF
    stream.dataReceived(frame(b"p" + b"x" * 32))
    assert stream.phase is R.CLOSED and node.refused == 1


def test_a_refused_upgrade_is_read_whole_and_told_to_the_link_before_any_handshake():
    clock, link, node, dial, ct, stream, st = _ends()
    dial.dataReceived(b"HTTP/1.1 401 No\r\nContent-Length: 0\r\n\r\n")
    assert dial.phase is D.PROVING and not dial.open and ct.value() == b""  # no hello sent
    [(told, why)] = link.told
    assert told == "failed" and isinstance(why, PeerRefused)
    with pytest.raises(ValueError, match="dialling: no move from PROVING on ACKED"):
        dial.acked()  # a batch is never acked before the handshake


def test_a_dial_that_fails_or_is_abandoned_is_closed_and_never_connected():
    link = _Link()
    refused = Dial(link, "s", 0.0)
    failed: list[Failure] = []
    refused.connect(lambda p: defer.fail(ConnectionRefusedError())).addErrback(failed.append)
    assert refused.phase is D.CLOSED and failed[0].check(ConnectionRefusedError)
    waiting = Dial(link, "s", 0.0)
    pending: defer.Deferred[Any] = defer.Deferred()
    waiting.connect(lambda p: pending).addErrback(failed.append)
    assert waiting.phase is D.CONNECTING
    waiting.abandon()
    assert waiting.phase is D.CLOSED and failed[1].check(defer.CancelledError)
    assert link.told == []  # a dial never connected is the link's own errback's


def test_a_dial_keeps_the_links_notes_through_its_methods():
    clock, link, node, dial, ct, stream, st = _ends()
    assert not dial.relay(b"x", 2)  # not open: not sent
    dial.dataReceived(SWITCHED)
    _cross(ct, stream)
    _cross(st, dial)
    ct.clear()
    assert dial.relay(b"x", 2) and dial.relay(b"y", 2) and not dial.relay(b"z", 2)
    assert [f[:1] for f in frames(ct.value())] == [b"r", b"r"] and dial.relays == 2
    assert dial.relay_answered() and dial.relay_answered() and not dial.relay_answered()
    flushed: list[int] = []
    dial.flush_at_turn_end(clock, lambda: flushed.append(1))
    dial.flush_at_turn_end(clock, lambda: flushed.append(2))  # once, however often asked
    assert dial.flush_due
    clock.advance(0)
    assert flushed == [1]
    dial.flushing()
    assert not dial.flush_due
    dial.flush_at_turn_end(clock, lambda: flushed.append(3))
    dial.cancel_flush()
    clock.advance(0)
    assert flushed == [1] and not dial.flush_due
    why = PeerRefused("no")
    dial.close(why, abort=True)
    assert dial.why is why and ct.disconnecting and dial.phase is D.OPEN  # until it is lost


# -- a link writes no field of its Dial -----------------------------------------------


def _recording_writers(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """Record, per attribute of every ``Dial``, the modules that set it."""
    writers: dict[str, set[str]] = {}

    def setattr_recorded(self: Dial, name: str, value: Any) -> None:
        module = sys._getframe(1).f_globals.get("__name__", "?")
        writers.setdefault(module, set()).add(name)
        object.__setattr__(self, name, value)

    monkeypatch.setattr(Dial, "__setattr__", setattr_recorded)
    return writers


def test_a_link_changes_its_dial_only_through_the_dials_methods(monkeypatch):
    writers = _recording_writers(monkeypatch)
    clock = _clock()
    # acks, the cork coming off at a turn's end, a batch that times out
    sender, receiver = _store("a"), _cluster(clock)
    receiver.ready = True
    pipe = Pipe(receiver)
    link = PeerLink("http://b", sender, "s", http=pipe, clock=clock, dial=pipe.dial)
    link.start()
    clock.advance(0)
    pipe.deliver()
    for _ in range(3):
        _published(sender, clock, 70)
        link.poke()
        link.poke()
        pipe.deliver()
        clock.advance(0)
        pipe.deliver()
    assert link.state == "up" and link.after == 210 and link._stream.answering
    _published(sender, clock, 1)
    link.poke()
    clock.advance(link.timeout)  # never delivered: no answer in time
    pipe.notice()
    assert link.state == "down" and link._stream is None
    # a dial that never connects, given up at the timeout, then a stop
    pending: defer.Deferred[Any] = defer.Deferred()
    link.dial = lambda protocol: pending
    link.kick()
    clock.advance(0)
    assert link._stream.phase is DiallingPhase.CONNECTING
    clock.advance(link.timeout)
    assert pending.called and link._stream is None  # abandoned: the backoff runs
    link.stop()
    # relays to a sibling, answered
    a, b, c, tcp_link, to_b, to_c = _worker_with_sibling(clock)
    _published(a, clock, 4)
    tcp_link.poke()
    clock.advance(0)
    to_b.deliver()
    to_c.deliver()
    assert c.store.message_count == 4 and b.siblings[0]._stream.relays == 0
    assert dial_module.__name__ in writers
    peers = "pushup.backplane.mesh.peers"
    assert peers not in writers, f"the link sets {sorted(writers[peers])} of its Dial"
