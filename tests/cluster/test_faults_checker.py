"""The history checker itself (history.check) on histories written by hand:
each broken promise it exists to catch is caught, and a kept one passes.
No processes: the fault tests run it on real ones."""
from __future__ import annotations

from dataclasses import dataclass, field

from tests.cluster.history import Attempt, Event, History, check


@dataclass
class Seen:
    name: str
    channels: list[str]
    log: list[Event]
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def history(*acked: tuple[str, int], unacked: tuple[tuple[str, int], ...] = ()) -> History:
    h = History()
    for ch, seq in acked:
        h.record(Attempt(ch, seq, "http://n1", 0.0, 1.0, 201, f"id-{ch}-{seq}"))
    for ch, seq in unacked:
        h.record(Attempt(ch, seq, "http://n1", 0.0, 1.0, 202, f"id-{ch}-{seq}"))
    return h


def subscriber(channels: list[str], *log: tuple[str, int] | str) -> Seen:
    """What a subscriber saw, in order: (channel, seq) or "gap"."""
    return Seen("sub", channels, [
        Event(2.0, "http://n2", "gap") if isinstance(e, str) else
        Event(2.0, "http://n2", "msg", e[0], e[1], f"id-{e[0]}-{e[1]}") for e in log])


def problems(h: History, s: Seen, allow_gaps: bool = False) -> list[str]:
    return check(h, [s], allow_gaps).problems


def test_every_acknowledged_message_once_in_order_is_kept() -> None:
    h = history(("a", 0), ("a", 1), ("b", 0), unacked=(("a", 2),))
    assert problems(h, subscriber(["a", "b"], ("a", 0), ("b", 0), ("a", 1))) == []
    # a publish without a 201 may be missing, or arrive once
    assert problems(h, subscriber(["a", "b"], ("a", 0), ("a", 2), ("b", 0), ("a", 1))) == []


def test_a_duplicate_is_caught_acknowledged_or_not() -> None:
    h = history(("a", 0), unacked=(("a", 1),))
    assert "received twice" in problems(h, subscriber(["a"], ("a", 0), ("a", 0)))[0]
    assert "received twice" in problems(h, subscriber(["a"], ("a", 0), ("a", 1), ("a", 1)))[0]


def test_acknowledged_messages_out_of_channel_order_are_caught() -> None:
    h = history(("a", 0), ("a", 1), ("b", 0))
    [p] = problems(h, subscriber(["a", "b"], ("a", 1), ("b", 0), ("a", 0)))
    assert "('a', 0)" in p and "after seq 1" in p


def test_a_silent_loss_is_caught_and_a_said_gap_excuses_only_where_allowed() -> None:
    h = history(("a", 0), ("a", 1), ("a", 2))
    [silent] = problems(h, subscriber(["a"], ("a", 0), ("a", 2)))
    assert "never received and no gap said" in silent
    said = subscriber(["a"], ("a", 0), "gap", ("a", 2))
    assert problems(h, said, allow_gaps=True) == []
    [lost] = problems(h, said, allow_gaps=False)  # a majority survived: no excuse
    assert "lost behind a gap" in lost
    # a gap said after the successor arrived does not cover the loss
    late = subscriber(["a"], ("a", 0), ("a", 2), "gap")
    assert "no gap said" in problems(h, late, allow_gaps=True)[0]


def test_a_message_stored_twice_under_another_id_is_caught() -> None:
    h = history(("a", 0))
    s = subscriber(["a"], ("a", 0))
    s.log[0].id = "id-other"
    assert "acknowledged as id-a-0" in problems(h, s)[0]



def test_messages_of_two_origins_may_interleave_but_each_origin_keeps_its_order() -> None:
    """The mesh orders a channel per origin: a later publish accepted by another
    node may arrive first (docs/faults.md, "Order"); one accepted by the same
    node may not."""
    def run(origin_of: dict[int, str], arrival: list[int]) -> list[str]:
        h = History()
        ids = {seq: f"{origin_of[seq]}-{seq + 1}" for seq in origin_of}
        for seq, ident in ids.items():
            h.record(Attempt("a", seq, "http://n1", 0.0, 1.0, 201, ident))
        log = [Event(2.0, "http://n2", "msg", "a", seq, ids[seq]) for seq in arrival]
        return problems(h, Seen("sub", ["a"], log))

    two_nodes = {0: "n1.e", 1: "n2.e", 2: "n1.e"}
    assert run(two_nodes, [1, 0, 2]) == []  # node 2's seq 1 overtook node 1's seq 0
    [p] = run(two_nodes, [2, 1, 0])  # node 1's seq 2 before its own seq 0
    assert "('a', 0)" in p and "after seq 2" in p and "same origin" in p
