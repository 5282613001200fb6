"""What presence holds in memory stays within what docs/operations.md
("Presence: sizing") states: loadtest/presence_memory.py's two shapes, 10,000
members in one channel and 100,000 channels with one member each, measured
with tracemalloc over one node's subscriptions and the cluster's roster. A
bound, not a timing: a change that makes a member or an occupied channel
cost more than stated fails here, and the table is to be measured again."""

from __future__ import annotations

from loadtest.presence_memory import measure

MiB = 2**20


def test_ten_thousand_members_in_one_channel_take_at_most_five_mib():
    found = measure(1, 10_000)
    assert found["members"] == 10_000
    assert found["bytes"] <= 5 * MiB, found  # stated: 4.2 MiB, ~440 B a member
    assert found["state_bytes"] <= 0.25 * MiB, found  # stated: 0.2 MiB


def test_a_hundred_thousand_single_member_channels_take_at_most_160_mib():
    found = measure(100_000, 1)
    assert found["channels"] == 100_000
    assert found["bytes"] <= 160 * MiB, found  # stated: 145-149 MiB, ~1.5 KB a channel
    assert found["state_bytes"] <= 4.5 * MiB, found  # stated: 4.0 MiB
