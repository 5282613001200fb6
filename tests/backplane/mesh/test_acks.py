"""Acks: publishes waiting for a peer, answered in order, on confirm or deadline."""

from twisted.internet.task import Clock

from pushup.backplane import Unconfirmed
from pushup.backplane.mesh.acks import Acks
from pushup.core.model import Message


def batch(*seqs: int) -> list[Message]:
    return [Message("me", s, s, ("c",), b"%d" % s) for s in seqs]


def watch(acks: Acks, answers: list, messages: list[Message]) -> None:
    acks.wait(messages).addCallback(answers.append)


def test_a_confirmation_answers_the_publishes_it_covers_in_order_and_no_more():
    acks, answers = Acks(Clock(), 2.0), []
    for seqs in ((1, 2), (3,), (4, 5)):
        watch(acks, answers, batch(*seqs))
    acks.confirm(4)  # the third publish ends at 5: still waiting
    assert [[m.seq for m in a] for a in answers] == [[1, 2], [3]]
    assert not any(isinstance(a, Unconfirmed) for a in answers) and len(acks) == 1
    acks.confirm(5)
    assert [m.seq for m in answers[-1]] == [4, 5] and len(acks) == 0


def test_a_publish_no_peer_confirms_in_time_is_answered_unconfirmed_at_its_deadline():
    clock = Clock()
    acks, answers = Acks(clock, 2.0), []
    watch(acks, answers, batch(1))
    clock.advance(1.0)
    watch(acks, answers, batch(2))
    clock.advance(1.0)
    assert len(answers) == 1 and isinstance(answers[0], Unconfirmed)
    acks.confirm(2)  # the second one's peer came through in time
    assert len(answers) == 2 and not isinstance(answers[1], Unconfirmed)
    clock.advance(5.0)
    assert len(answers) == 2 and acks.unconfirmed == 1 and not clock.getDelayedCalls()


def test_giving_up_answers_everyone_unconfirmed_at_once():
    clock = Clock()
    acks, answers = Acks(clock, 2.0), []
    watch(acks, answers, batch(1))
    watch(acks, answers, batch(2, 3))
    acks.give_up()
    assert [type(a) for a in answers] == [Unconfirmed, Unconfirmed]
    assert [m.seq for m in answers[1]] == [2, 3] and acks.unconfirmed == 2
