"""Where a peer connection is, at either end: named phases, and every move
between them in the two tables of this module (h11's ``_state.py``, as
:mod:`pushup.http.phase` keeps an HTTP connection's).

A replication stream has two ends. The receiving end (``PeerStream``, the
node a batch comes to) waits for the dialler's hello, then for its proof,
then takes batches until it closes the connection or loses it. The
dialling end (``Dial``, one connection of a ``PeerLink``) connects, reads
the peer's HTTP answer to its ``Upgrade``, proves itself, sends batches,
and counts the first ack on a connection (a sibling's socket then counts as
holding what it took: ``PeerLink.holds``). Each end moves its phase only
with ``receiving_after`` / ``dialling_after``; a move the tables do not list
is a bug and raises ``ValueError``. Pure values: no socket, no clock. That a
link has given a connection up (``Dial.why``) is not a phase: the connection
stays where it was until it is lost, as the peer sees it.
"""

from __future__ import annotations

from enum import Enum
from typing import Final


class ReceivingPhase(Enum):
    """The receiving end; the value is the word its log lines say."""

    HELLO = "hello"  # waiting for the dialler's hello (``h``)
    PROOF = "proof"  # challenged it (``c``): waiting for its proof (``p``)
    OPEN = "open"  # it holds the secret: batches in, answers out
    CLOSED = "closed"  # refused, ended or lost: what still comes is read into nothing


class ReceivingEvent(Enum):
    HELLO = 0  # a hello was heard, and answered with our challenge
    PROVEN = 1  # the dialler's proof is right
    CLOSE = 2  # this end refuses or ends the connection (a reason goes first)
    LOST = 3  # the connection is gone


class DiallingPhase(Enum):
    """The dialling end, in the order a connection goes through them."""

    CONNECTING = 0  # dialled: not connected yet
    ASKING = 1  # connected, the ``Upgrade`` sent: reading the HTTP answer
    PROVING = 2  # the answer is read (a 101: our hello sent): the handshake's frames come
    OPEN = 3  # authenticated both ways: batches out, answers in
    ANSWERING = 4  # open, and the peer has acked a batch on it
    CLOSED = 5  # lost, or never connected


class DiallingEvent(Enum):
    CONNECTED = 0  # the connection is made
    ANSWERED = 1  # the HTTP answer's head is complete (whatever its status)
    PROVEN = 2  # the peer's proof is right, and ours sent
    ACKED = 3  # the peer acked a batch
    LOST = 4  # the connection is gone, or the dial failed (or was abandoned)


_R = ReceivingPhase
_RE = ReceivingEvent
_D = DiallingPhase
_DE = DiallingEvent

# {phase: {what happens: the next phase}}. Missing: cannot happen.
_ENDS = {_RE.CLOSE: _R.CLOSED, _RE.LOST: _R.CLOSED}
RECEIVING_MOVES: Final[dict[ReceivingPhase, dict[ReceivingEvent, ReceivingPhase]]] = {
    _R.HELLO: {_RE.HELLO: _R.PROOF, **_ENDS},
    _R.PROOF: {_RE.PROVEN: _R.OPEN, **_ENDS},
    _R.OPEN: {**_ENDS},
    # A closed stream says its reason once: only the connection's loss follows.
    _R.CLOSED: {_RE.LOST: _R.CLOSED},
}

_LOST = {_DE.LOST: _D.CLOSED}
DIALLING_MOVES: Final[dict[DiallingPhase, dict[DiallingEvent, DiallingPhase]]] = {
    _D.CONNECTING: {_DE.CONNECTED: _D.ASKING, **_LOST},
    _D.ASKING: {_DE.ANSWERED: _D.PROVING, **_LOST},
    _D.PROVING: {_DE.PROVEN: _D.OPEN, **_LOST},
    _D.OPEN: {_DE.ACKED: _D.ANSWERING, **_LOST},
    _D.ANSWERING: {_DE.ACKED: _D.ANSWERING, **_LOST},
    # One connection, lost once: the link dials a new one.
    _D.CLOSED: {},
}


def receiving_after(phase: ReceivingPhase, event: ReceivingEvent) -> ReceivingPhase:
    """The receiving end's phase after ``event``; ValueError for a move that cannot happen."""
    after = RECEIVING_MOVES[phase].get(event)
    if after is None:
        raise ValueError(f"receiving: no move from {phase.name} on {event.name}")
    return after


def dialling_after(phase: DiallingPhase, event: DiallingEvent) -> DiallingPhase:
    """The dialling end's phase after ``event``; ValueError for a move that cannot happen."""
    after = DIALLING_MOVES[phase].get(event)
    if after is None:
        raise ValueError(f"dialling: no move from {phase.name} on {event.name}")
    return after
