"""pushup/http/phase.py: a connection's two phases and the moves between them.

The tables are read as the rules they state (closing is one-way, a lost
connection stays lost, one request is answered at a time, a stream is the
last answer, a stopped reader reads nothing more); then a real connection
(conftest's node over a ``StringTransport``) is seen to go through them.
"""

from __future__ import annotations

import pytest

from pushup.http.phase import (
    ANSWER_MOVES,
    READ_MOVES,
    Answer,
    Answering,
    Read,
    Reading,
    answer_after,
    answering_one,
    finished,
    read_after,
)

A = Answering


def moves_from(phase: Answering) -> dict[Answer, Answering]:
    return {event: answer_after(phase, event) for event in Answer
            if event in ANSWER_MOVES[phase]}


def test_every_phase_has_its_row_and_every_move_lands_on_a_phase():
    assert set(ANSWER_MOVES) == set(Answering) and set(READ_MOVES) == set(Reading)
    for row in ANSWER_MOVES.values():
        assert all(isinstance(to, Answering) for to in row.values())
    for read_row in READ_MOVES.values():
        assert all(isinstance(to, Reading) for to in read_row.values())


def test_the_numbers_say_which_phases_answer_one_request_and_which_answer_nothing_more():
    assert {p for p in Answering if answering_one(p)} == {A.HELD, A.PENDING, A.STREAMING}
    assert {p for p in Answering if finished(p)} == {A.CLOSING, A.UPGRADED, A.CLOSED}


def test_closing_is_one_way_nothing_leads_back_to_answering():
    assert set(moves_from(A.CLOSING).values()) == {A.CLOSING, A.CLOSED}
    assert moves_from(A.CLOSING)[Answer.ANSWER] == A.CLOSING  # a late answer is not sent
    assert set(moves_from(A.UPGRADED).values()) == {A.UPGRADED, A.CLOSED}
    # from any phase that answers, closing lands on CLOSING
    for phase in (A.READY, A.HELD, A.PENDING, A.STREAMING, A.PAUSED):
        assert answer_after(phase, Answer.CLOSE) == A.CLOSING


def test_a_lost_connection_is_closed_from_every_phase_and_stays_closed():
    assert {answer_after(phase, Answer.LOST) for phase in Answering} == {A.CLOSED}
    assert {answer_after(A.CLOSED, event) for event in Answer} == {A.CLOSED}


def test_one_request_is_answered_at_a_time():
    assert answer_after(A.READY, Answer.HOLD) == A.HELD
    assert answer_after(A.READY, Answer.PEND) == A.PENDING
    for busy in (A.HELD, A.PENDING):
        assert answer_after(busy, Answer.ANSWER) == A.READY
        # (a pending answer may turn out to be its own hold or stream: below)
        others = (Answer.PEND, Answer.UPGRADE) if busy == A.PENDING else (
            Answer.HOLD, Answer.PEND, Answer.STREAM, Answer.UPGRADE)
        for another in others:
            with pytest.raises(ValueError, match=f"no move from {busy.name} on {another.name}"):
                answer_after(busy, another)


def test_a_pending_answer_may_turn_out_to_be_a_hold_or_an_event_stream():
    # a poll whose channels the node reads first (the Redis engine's cold poll)
    assert answer_after(A.PENDING, Answer.HOLD) == A.HELD
    assert answer_after(A.PENDING, Answer.STREAM) == A.STREAMING


def test_a_fan_out_pauses_the_connection_until_it_ends():
    paused = answer_after(answer_after(A.HELD, Answer.ANSWER), Answer.PAUSE)
    assert paused == A.PAUSED
    for event in (Answer.HOLD, Answer.PEND, Answer.STREAM, Answer.ANSWER):
        with pytest.raises(ValueError):
            answer_after(paused, event)
    assert answer_after(paused, Answer.RELEASE) == A.READY


def test_an_event_stream_is_the_last_answer_on_its_connection():
    streaming = answer_after(A.READY, Answer.STREAM)
    assert answer_after(streaming, Answer.HOLD) == A.STREAMING  # its own hold
    assert set(moves_from(streaming).values()) == {A.STREAMING, A.CLOSING, A.CLOSED}
    with pytest.raises(ValueError):
        answer_after(streaming, Answer.ANSWER)  # nothing answers it as a poll


def test_a_request_is_read_head_then_body_and_a_stopped_reader_reads_nothing_more():
    phase = Reading.IDLE
    for event, expected in ((Read.BEGIN, Reading.HEAD), (Read.HEAD_DONE, Reading.BODY),
                            (Read.DONE, Reading.IDLE)):
        phase = read_after(phase, event)
        assert phase == expected
    with pytest.raises(ValueError, match="no move from BODY on BEGIN"):
        read_after(Reading.BODY, Read.BEGIN)
    assert {read_after(phase, Read.STOP) for phase in Reading} == {Reading.STOPPED}
    assert {read_after(Reading.STOPPED, event) for event in Read} == {Reading.STOPPED}


# -- a real connection through the phases --------------------------------------


def raw_get(path: str, version: str = "1.1") -> bytes:
    return f"GET {path} HTTP/{version}\r\nHost: x\r\n\r\n".encode()


def test_a_held_poll_holds_its_connection_until_the_fan_out_has_answered_it(node):
    conn = node.connect()
    assert conn.protocol.answering is A.READY
    conn.send(raw_get("/subscribe?channels=c&timeout=30"))
    assert conn.protocol.answering is A.HELD
    node.publish("c", "hi")
    node.turn()
    [answer] = conn.responses()
    assert answer.status == 200 and conn.protocol.answering is A.READY


def test_an_answer_that_ends_the_connection_leaves_it_closing_then_closed(node):
    conn = node.connect()
    # straight to the protocol: Conn.send would complete the close at once
    conn.protocol.dataReceived(raw_get("/subscribe?channels=c&timeout=0", version="1.0"))
    [answer] = conn.responses()
    assert answer.header("connection") == "close" and conn.transport.disconnecting
    assert conn.protocol.answering is A.CLOSING
    conn.close()  # the close completes
    assert conn.protocol.answering is A.CLOSED


def test_an_event_stream_keeps_its_connection_streaming(node):
    conn = node.connect()
    conn.send(b"GET /subscribe?channels=c HTTP/1.1\r\nHost: x\r\n"
              b"Accept: text/event-stream\r\n\r\n")
    node.turn()
    assert conn.protocol.answering is A.STREAMING
