"""Where an HTTP connection is, as h11 keeps it: named phases, and every move
between them in the two tables of this module.

A connection has two phases side by side. ``Reading`` is where the parser is
in the client's next request: between requests, in its head, in its body, or
stopped for good (nothing more is read as HTTP). ``Answering`` is what the
connection does with the requests read: answers them in order, waits on one
(held, pending, an event stream), waits for a fan-out to end, closes, has
handed the connection to another protocol, or is gone. The protocol moves a
phase only with ``read_after`` and ``answer_after``; a move the tables do not
list is a bug and raises ``ValueError``; the phases are numbered in the order
that ``answering_one`` and ``finished`` read. Pure values: no socket, no clock.
Flow control (reading paused for read-ahead, output not taken) is not a
phase: it holds in any of them.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final


class Reading(IntEnum):
    IDLE = 0  # between requests (the next one's first byte not yet read)
    HEAD = 1  # in a request's head: its header timeout runs
    BODY = 2  # in its body: a stall longer than a keep-alive ends it
    STOPPED = 3  # nothing more is parsed (a refusal, a bad request, an upgrade refused)


class Read(IntEnum):
    """What the parser reports."""

    BEGIN = 0  # a request's first byte
    HEAD_DONE = 1  # its head is complete
    DONE = 2  # it is complete, body and all
    STOP = 3  # nothing after this is read


class Answering(IntEnum):
    READY = 0  # answers what is queued, in order, as it comes
    HELD = 1  # a subscribe is held: ``respond`` answers it
    PENDING = 2  # an answer is on its way (a Deferred)
    STREAMING = 3  # an event stream is open: the connection's last answer
    PAUSED = 4  # answered during a fan-out: nothing more until it ends
    CLOSING = 5  # what was written goes out; nothing more is answered
    UPGRADED = 6  # another protocol has the connection (after a 101)
    CLOSED = 7  # the connection is gone


class Answer(IntEnum):
    """What happens to the connection's answering."""

    HOLD = 0  # the handlers hold the request
    PEND = 1  # the handlers answer later
    STREAM = 2  # an event stream opens
    ANSWER = 3  # the held or pending request is answered
    PAUSE = 4  # that answer went out in a fan-out: wait for its end
    RELEASE = 5  # the fan-out ended
    CLOSE = 6  # close once what was written is sent
    UPGRADE = 7  # the connection goes to another protocol
    LOST = 8  # the connection is gone


_R = Reading
_A = Answering

# {phase: {what happens: the next phase}}. Missing: cannot happen.
READ_MOVES: Final[dict[Reading, dict[Read, Reading]]] = {
    _R.IDLE: {Read.BEGIN: _R.HEAD, Read.STOP: _R.STOPPED},
    _R.HEAD: {Read.HEAD_DONE: _R.BODY, Read.STOP: _R.STOPPED},
    _R.BODY: {Read.DONE: _R.IDLE, Read.STOP: _R.STOPPED},
    # The parser may still report requests pipelined in the same bytes: they
    # are read and never answered.
    _R.STOPPED: {Read.BEGIN: _R.STOPPED, Read.HEAD_DONE: _R.STOPPED, Read.DONE: _R.STOPPED,
                 Read.STOP: _R.STOPPED},
}

_GONE = {Answer.LOST: _A.CLOSED}
ANSWER_MOVES: Final[dict[Answering, dict[Answer, Answering]]] = {
    _A.READY: {Answer.HOLD: _A.HELD, Answer.PEND: _A.PENDING, Answer.STREAM: _A.STREAMING,
               Answer.PAUSE: _A.PAUSED, Answer.RELEASE: _A.READY, Answer.CLOSE: _A.CLOSING,
               Answer.UPGRADE: _A.UPGRADED, **_GONE},
    _A.HELD: {Answer.ANSWER: _A.READY, Answer.CLOSE: _A.CLOSING, **_GONE},
    # a pending answer may turn out to be a hold, or an event stream (a poll
    # whose channels the node had to read first)
    _A.PENDING: {Answer.ANSWER: _A.READY, Answer.HOLD: _A.HELD, Answer.STREAM: _A.STREAMING,
                 Answer.CLOSE: _A.CLOSING, **_GONE},
    # the stream's own hold comes after it opened
    _A.STREAMING: {Answer.HOLD: _A.STREAMING, Answer.CLOSE: _A.CLOSING, **_GONE},
    # (a request read meanwhile may upgrade the connection: it answers nothing more)
    _A.PAUSED: {Answer.RELEASE: _A.READY, Answer.CLOSE: _A.CLOSING,
                Answer.UPGRADE: _A.UPGRADED, **_GONE},
    # Closing is one-way: what was under way ends there (an answer that comes
    # is not sent, a fan-out's end answers nothing more).
    _A.CLOSING: {Answer.HOLD: _A.CLOSING, Answer.ANSWER: _A.CLOSING, Answer.PAUSE: _A.CLOSING,
                 Answer.RELEASE: _A.CLOSING, Answer.CLOSE: _A.CLOSING, **_GONE},
    # the upgraded protocol closes the connection, and keeps it until it is gone
    _A.UPGRADED: {Answer.CLOSE: _A.UPGRADED, Answer.RELEASE: _A.UPGRADED, **_GONE},
    _A.CLOSED: {event: _A.CLOSED for event in Answer},
}

# The protocol keeps a phase as its number, and moves it by the same tables
# indexed by number, [phase][event] (-1: cannot happen): compiled, that is a
# native int to compare and two tuple reads, where an enum member is an object
# to hash (~19 ns a move, measured, and a request makes about eight).
IDLE: Final = Reading.IDLE.value
HEAD: Final = Reading.HEAD.value
BODY: Final = Reading.BODY.value
STOPPED: Final = Reading.STOPPED.value
READY: Final = Answering.READY.value
HELD: Final = Answering.HELD.value
PAUSED: Final = Answering.PAUSED.value
STREAMING: Final = Answering.STREAMING.value
CLOSING: Final = Answering.CLOSING.value
_READ_NEXT: Final[tuple[tuple[int, ...], ...]] = tuple(
    tuple(int(READ_MOVES[p].get(e, -1)) for e in Read) for p in Reading)
_ANSWER_NEXT: Final[tuple[tuple[int, ...], ...]] = tuple(
    tuple(int(ANSWER_MOVES[p].get(e, -1)) for e in Answer) for p in Answering)


def answering_one(phase: int) -> bool:
    """A request is being answered (held, pending, a stream): none behind it yet."""
    return HELD <= phase <= STREAMING


def finished(phase: int) -> bool:
    """Nothing more is answered on the connection (closing, upgraded, closed)."""
    return phase >= CLOSING


def read_after(phase: int, event: int) -> int:
    """The reading phase after ``event``; ValueError for a move that cannot happen."""
    after = _READ_NEXT[phase][event]
    if after < 0:
        raise ValueError(f"reading: no move from {Reading(phase).name} on {Read(event).name}")
    return after


def answer_after(phase: int, event: int) -> int:
    """The answering phase after ``event``; ValueError for a move that cannot happen."""
    after = _ANSWER_NEXT[phase][event]
    if after < 0:
        raise ValueError(
            f"answering: no move from {Answering(phase).name} on {Answer(event).name}")
    return after
