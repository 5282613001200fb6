"""A store's image: everything it holds, as one frozen value.

A node fills an empty store from an image (``Store.load``): the data
directory reads one back from disk (:mod:`pushup.backplane.disk`), a peer's
snapshot decodes into one (:mod:`pushup.backplane.mesh.wire`), and a store
makes one of itself for a peer that catches up (``Store.image``). Values
only: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from pushup.core.channels import Channel
from pushup.core.idempotency import Remembered
from pushup.core.model import Message


@dataclass(frozen=True, slots=True)
class ChannelImage:
    """A channel's lifetime and eviction record (its messages are the image's)."""

    name: str
    ttl: int  # µs
    expires_at: int  # µs since the epoch
    evicted: tuple[tuple[str, int], ...]  # (origin, highest evicted seq)
    evicted_ts: int


@dataclass(frozen=True, slots=True)
class StoreImage:
    """What a store holds, in the order it is loaded back.

    ``messages`` are in timestamp order, each with the channels that still
    hold it (a peer's snapshot does not say, so those are all its
    channels). ``horizon`` and ``lost`` are per origin: how far the store
    holds it, and the last (seq, ts) of its history lost everywhere.
    ``last_ts`` is the last timestamp this node's id handed out (0 when
    unknown): a restarted node's timestamps never go back past it.
    """

    horizon: tuple[tuple[str, int], ...]
    lost: tuple[tuple[str, int, int], ...]  # (origin, seq, ts)
    channels: tuple[ChannelImage, ...]
    messages: tuple[tuple[Message, tuple[str, ...]], ...]
    keys: tuple[Remembered, ...] = ()
    last_ts: int = 0


def channel_of(image: ChannelImage, now: int) -> Channel:
    """A live channel as ``image`` describes it (it holds no message yet)."""
    channel = Channel(image.name, image.ttl, now)
    channel.expires_at = image.expires_at
    channel.evicted = dict(image.evicted)
    channel.evicted_ts = image.evicted_ts
    return channel
