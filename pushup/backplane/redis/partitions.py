"""The Redis engine's partitions: where a channel lives, the keys of each
partition, and the Lua scripts that append to its log.

The rule: a channel lives in one of K partitions (its name hashed, or the
part of it in ``{…}``, as Redis Cluster hashes keys), every key of partition
T carries the hash tag ``{T}`` (one Cluster slot), and every write to a
partition is one script call that appends to its log, to the own stream of
each channel the entry concerns, and notifies each of those channels on its
own sharded channel: a node hears of the channels it follows, and no other
(delivery by interest, per channel). Values and text only: no connection
(``publishing.py`` and ``reader.py`` run them).

Keys of partition T (see ``PartitionKeys``):

- ``pushup:{T}:log``: a stream; entry id ``<seq>-0``; fields ``t`` (µs),
  ``k`` (``m`` a message, ``o`` a channel operation, ``f`` a note that a
  channel of T has messages in another partition), ``c`` (channels JSON, or
  the channel's name), ``d`` (the message's data JSON exactly as accepted,
  the operation as JSON, or the other partition's number);
- ``pushup:{T}:meta``: a hash: ``e`` the log's epoch, ``s`` its last
  sequence number, ``t`` its last timestamp;
- ``pushup:{T}:channels``: the partition's explicit channels, name → JSON
  ``{"ttl", "expires_at"}``, so they outlive the log's trimming;
- ``pushup:{T}:foreign``: channel → JSON list of the other partitions that
  hold messages of it (a message published to several channels goes to
  its first channel's partition: a follower of another of its channels
  must follow that partition too);
- ``pushup:{T}:key:<Idempotency-Key>``: a keyed publish's part in T, JSON
  ``{"e", "f", "s", "t", "n"}`` (epoch, the whole body's fingerprint, first
  sequence number and timestamp, count), expiring after the window;
- ``pushup:{T}:c:<epoch>:<channel>``: a stream of the log's entries that
  concern one channel (a message naming it, an operation or a foreign note
  on it), the same ids and fields plus ``p``, the channel's previous entry
  (0: none), so that a node reads one channel's history without the
  partition's, and sees a missed entry; trimmed like the log, and gone once
  idle for twice the message ttl;
- ``pushup:{T}:n:<channel>``: the sharded channel the script notifies that
  channel's followers on, MessagePack ``[epoch, seq, t, k, c, d, p, …]``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pushup.backplane.redis.client import script_sha
from pushup.backplane.redis.scripts import read_script
from pushup.backplane.redis.slots import SLOTS, hash_tag, key_slot
from pushup.config import Config

BALANCED_UP_TO = 256  # up to this many partitions, tags are chosen for even slots

# The scripts, each in its own file (pushup.backplane.redis.scripts), whose head
# says its KEYS, ARGV and reply: both begin by checking the log against the
# calling node (log_checked.lua), then CHECK returns {epoch, seq} and PUBLISH
# appends a batch.
_CHECKED = read_script("log_checked")
CHECK = _CHECKED + read_script("log_check")
PUBLISH = _CHECKED + read_script("log_publish")
READ_CHANNELS = _CHECKED + read_script("log_channels")
PUBLISH_SHA = script_sha(PUBLISH)
CHECK_SHA = script_sha(CHECK)
READ_CHANNELS_SHA = script_sha(READ_CHANNELS)

decode_told = msgspec.msgpack.Decoder(list[Any])


def partition_tags(count: int) -> list[str]:
    """The hash tag of each of ``count`` partitions: ``p<i>``, or ``p<i>-<j>``
    for the first ``j`` whose slot falls in the ``i``-th of ``count`` even
    slices of the slot space, so that partitions spread evenly over the
    primaries of any cluster whose slots are split in even ranges."""
    if count > BALANCED_UP_TO:  # many partitions spread over the slots by themselves
        return [f"p{i}" for i in range(count)]
    tags = []
    for i in range(count):
        j = 0
        while True:
            tag = f"p{i}" if j == 0 else f"p{i}-{j}"
            if key_slot(tag) * count // SLOTS == i:
                break
            j += 1
        tags.append(tag)
    return tags


def partition_of(channel: str, count: int) -> int:
    """The partition a channel lives in: its hash tag's CRC-32, modulo ``count``."""
    return zlib.crc32(hash_tag(channel).encode()) % count


@dataclass(frozen=True, slots=True)
class PartitionKeys:
    """One partition's number, hash tag and Redis keys (see the module's rule):
    what names it, never how far a node follows it (``following.Partition``)."""

    index: int
    tag: str
    log: str = field(init=False)
    meta: str = field(init=False)
    channels: str = field(init=False)
    foreign: str = field(init=False)
    key: str = field(init=False)  # + the Idempotency-Key
    notify: str = field(init=False)  # + a channel's name: where it is notified

    def __post_init__(self) -> None:
        prefix = f"pushup:{{{self.tag}}}:"
        for name, suffix in (("log", "log"), ("meta", "meta"), ("channels", "channels"),
                             ("foreign", "foreign"), ("key", "key:"), ("notify", "n:")):
            object.__setattr__(self, name, prefix + suffix)

    def notify_of(self, channel: str) -> str:
        """The sharded channel a channel of this partition is notified on."""
        return self.notify + channel

    def stream_of(self, epoch: str, channel: str) -> str:
        """A channel's own stream of this partition's log at ``epoch``."""
        return f"pushup:{{{self.tag}}}:c:{epoch}:{channel}"


def epoch_of(reply: list[Any]) -> str:
    """A script's epoch (its reply's first value)."""
    epoch: str = reply[0].decode()
    return epoch


def keys_of(channel: str, partitions: int | None = None) -> PartitionKeys:
    """The keys of the partition ``channel`` lives in, with ``partitions`` of them
    (default: ``--redis-partitions``'s), to look at a channel's log in Redis."""
    count = Config().redis_partitions if partitions is None else partitions
    index = partition_of(channel, count)
    return PartitionKeys(index, partition_tags(count)[index])
