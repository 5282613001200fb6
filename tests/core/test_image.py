"""pushup/core/image.py: an image is a frozen value, and a channel read back from one
has the lifetime and eviction record it had (so a reader behind what was evicted
still gets its gap after a restart or a snapshot), and no message yet."""

from __future__ import annotations

import dataclasses

import pytest

from pushup.core.cursor import Cursor
from pushup.core.image import ChannelImage, StoreImage, channel_of


def test_a_channel_read_back_keeps_its_lifetime_and_what_was_evicted():
    image = ChannelImage("news", ttl=60_000_000, expires_at=5_000_000_000,
                         evicted=(("n1.a", 7), ("n2.b", 3)), evicted_ts=4_000_000_000)
    channel = channel_of(image, now=4_500_000_000)
    assert (channel.name, channel.ttl, channel.expires_at) == ("news", 60_000_000,
                                                               5_000_000_000)
    assert channel.evicted == {"n1.a": 7, "n2.b": 3} and channel.evicted_ts == 4_000_000_000
    assert channel.runs == {} and channel.count == 0 and channel.oldest() is None
    assert channel.has_gap(Cursor.of({"n1.a": 7})) and not channel.has_gap(
        Cursor.of({"n1.a": 7, "n2.b": 3}))
    assert channel.has_gap(3_999_999_999) and not channel.has_gap(4_000_000_000)


def test_an_image_is_a_frozen_value():
    image = StoreImage(horizon=(("n1.a", 2),), lost=(), channels=(), messages=())
    assert (image.keys, image.last_ts) == ((), 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        image.last_ts = 5  # type: ignore[misc]
