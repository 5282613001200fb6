"""pushup/core/runs.py: a run holds an origin's messages in sequence order whatever
order they are added and removed in, and ``merge`` reads several runs as one stream
in (timestamp, id) order, each message once, within its limit, ``until`` and room."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pushup.core.model import Message
from pushup.core.runs import OldestHeads, Run, merge, oldest_head


def msg(seq: int, origin: str = "o.1", ts: int | None = None, data: bytes = b"1") -> Message:
    return Message(origin, seq, seq * 10 if ts is None else ts, ("c",), data)


def run_of(*messages: Message) -> Run:
    run = Run()
    for m in messages:
        run.add(m)
    return run


def seqs(run: Run) -> list[int]:
    return [m.seq for m in run]


def test_messages_added_out_of_order_read_back_in_sequence_order():
    run = run_of(msg(1), msg(4), msg(2), msg(5), msg(3))
    assert seqs(run) == [1, 2, 3, 4, 5]
    assert len(run) == 5 and run[0].seq == 1 and run[-1].seq == 5


def test_removing_the_oldest_then_others_keeps_the_rest_in_order():
    ms = [msg(s) for s in range(1, 8)]
    run = run_of(*ms)
    run.remove(ms[0])
    run.remove(ms[1])
    run.remove(ms[4])  # from the middle
    assert seqs(run) == [3, 4, 6, 7]
    run.add(msg(5))  # back into the middle after the head moved
    assert seqs(run) == [3, 4, 5, 6, 7]
    with pytest.raises(IndexError):
        run[5]


def test_removing_a_message_the_run_does_not_hold_is_a_value_error():
    held = msg(1)
    run = run_of(held, msg(2))
    with pytest.raises(ValueError, match="is not in this run"):
        run.remove(msg(1))  # the same seq, another message
    with pytest.raises(ValueError):
        run.remove(msg(9))
    run.remove(held)
    assert seqs(run) == [2]


def test_an_emptied_run_is_false_and_takes_new_messages():
    ms = [msg(1), msg(2)]
    run = run_of(*ms)
    for m in ms:
        run.remove(m)
    assert not run and len(run) == 0 and list(run) == []
    run.add(msg(3))
    assert seqs(run) == [3]


def test_bisects_and_first_after_count_from_the_head():
    ms = [msg(s) for s in range(1, 6)]  # ts 10..50
    run = run_of(*ms)
    run.remove(ms[0])  # the head moves: indexes start at seq 2
    assert run.bisect_key_left(3) == 1 and run.bisect_key_right(3) == 2
    assert run.bisect_key_left(1) == 0 and run.bisect_key_right(9) == 4
    assert run.first_after(0) == 0
    assert run.first_after(30) == 2  # seq 4 (ts 40) is the first after 30
    assert run.first_after(50) == 4
    assert [m.seq for m in run.islice(1, 3)] == [3, 4]


def test_merge_reads_runs_in_time_order_each_message_once():
    a, b = msg(1, "a.1", ts=10), msg(1, "b.1", ts=20)
    c = msg(2, "a.1", ts=30)
    one, two = run_of(a, c), run_of(b, c)  # c on two channels' runs
    taken, rest = merge([iter(one), iter(two)], limit=10, until=None, room=None)
    assert taken == [a, b, c] and rest == []


def test_merge_stops_at_limit_until_and_room_and_names_what_comes_next():
    ms = [msg(s, data=b"x" * 50) for s in range(1, 6)]
    taken, rest = merge([iter(run_of(*ms))], limit=2, until=None, room=None)
    assert taken == ms[:2] and rest == [ms[2]]
    taken, rest = merge([iter(run_of(*ms))], limit=10, until=30, room=None)
    assert taken == ms[:3] and rest == [ms[3]]
    taken, rest = merge([iter(run_of(*ms))], limit=10, until=None, room=ms[0].size * 2)
    assert taken == ms[:2] and rest == [ms[2]]
    taken, _ = merge([iter(run_of(*ms))], limit=10, until=None, room=1)
    assert taken == ms[:1]  # always one, however large


def test_merge_moves_every_stream_past_the_last_message_taken():
    shared = msg(1, "a.1", ts=10)
    later = msg(2, "a.1", ts=20)
    taken, rest = merge([iter(run_of(shared, later)), iter(run_of(shared))], limit=1,
                        until=None, room=None)
    assert taken == [shared] and rest == [later]  # not `shared` again


@given(st.lists(st.integers(1, 40), unique=True),
       st.lists(st.integers(0, 1000)))
def test_any_order_of_adds_and_removes_keeps_exactly_the_held_seqs_in_order(added, picks):
    run, held = Run(), {}
    for seq in added:
        held[seq] = msg(seq)
        run.add(held[seq])
    for pick in picks[: len(added)]:
        if not held:
            break
        seq = sorted(held)[pick % len(held)]
        run.remove(held.pop(seq))
    assert seqs(run) == sorted(held)
    assert [run[i].seq for i in range(len(run))] == sorted(held)


@given(st.lists(st.lists(st.integers(1, 30), unique=True), min_size=1, max_size=4),
       st.integers(1, 50))
def test_merge_is_the_sorted_union_of_its_streams_cut_at_limit(channel_seqs, limit):
    pool = {s: msg(s, ts=s * 10) for s in range(1, 31)}  # one origin; runs share messages
    runs = [run_of(*(pool[s] for s in chosen)) for chosen in channel_seqs]
    taken, rest = merge([iter(r) for r in runs], limit, until=None, room=None)
    union = sorted({s for chosen in channel_seqs for s in chosen})
    assert [m.seq for m in taken] == union[:limit]
    after = union[limit:]
    assert all(m.seq in after for m in rest) and (not after or min(after) in
                                                   {m.seq for m in rest})


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(1, 40), st.integers(0, 50),
                          st.booleans()), max_size=120))
def test_the_oldest_head_is_the_oldest_of_the_runs_heads_through_any_adds_and_removes(ops):
    """``OldestHeads`` answers what a walk of every run's head answers, whatever
    runs gain and lose, in any order: the store's retention takes that one first."""
    runs: dict[str, Run] = {}
    heads = OldestHeads(runs)
    held: dict[tuple[str, int], Message] = {}
    for origin, seq, ts, add in ops:
        key = (origin, seq)
        if add and key not in held:
            m = held[key] = msg(seq, origin=origin, ts=ts)
            run = runs.setdefault(origin, Run())
            run.add(m)
            if run[0] is m:
                heads.moved(origin)
        elif not add and key in held:
            m = held.pop(key)
            run = runs[origin]
            was_head = run[0] is m
            run.remove(m)
            if not run:
                del runs[origin]
            elif was_head:
                heads.moved(origin)
        assert heads.oldest() is oldest_head(runs.values())
