"""The in-process replication harness (loadtest/bench/replication.py) at tiny
scale: every publish is answered 201, with and without a sibling. It asserts
no timing."""

from __future__ import annotations

from loadtest.bench.replication import HeapClock, main, run


def test_every_publish_is_answered_with_and_without_a_sibling(capsys) -> None:
    clock = HeapClock()
    clock.advance(1_763_800_000.0)
    for sibling in (False, True):
        per_publish, delivering = run(clock, sibling, 30)  # asserts 30 answers of 201
        assert per_publish > 0 and (delivering > 0) == sibling
    main(["30"])
    assert "with a sibling" in capsys.readouterr().out
    main(["30", "--per-turn", "10"])
    assert "(best of 3, 30 publishes, 10 a turn)" in capsys.readouterr().out
