"""The Redis engine's partitions: where a channel lives, the keys of each
partition, and the Lua scripts that append to its log.

The rule: a channel lives in one of K partitions (its name hashed, or the
part of it in ``{…}``, as Redis Cluster hashes keys), every key of partition
T carries the hash tag ``{T}`` (one Cluster slot), and every write to a
partition is one script call that appends to its log and notifies its
followers. Values and text only: no connection (``publishing.py`` and
``reader.py`` run them).

Keys of partition T (see ``Partition``):

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
- ``pushup:{T}:n``: the sharded channel the script notifies on, MessagePack
  ``[epoch, seq, t, k, c, d, seq, t, k, c, d, …]``.
"""

from __future__ import annotations

import secrets
import zlib
from typing import Any

import msgspec

from pushup.backplane.redis.client import script_sha
from pushup.backplane.redis.scripts import read_script
from pushup.backplane.redis.slots import SLOTS, key_slot
from pushup.config import Config

BALANCED_UP_TO = 256  # up to this many partitions, tags are chosen for even slots

# The scripts, each in its own file (pushup.backplane.redis.scripts), whose head
# says its KEYS, ARGV and reply: both begin by checking the log against the
# calling node (log_checked.lua), then CHECK returns {epoch, seq} and PUBLISH
# appends a batch.
_CHECKED = read_script("log_checked")
CHECK = _CHECKED + read_script("log_check")
PUBLISH = _CHECKED + read_script("log_publish")
PUBLISH_SHA = script_sha(PUBLISH)
CHECK_SHA = script_sha(CHECK)

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


def hash_tag(name: str) -> str:
    """What of a name is hashed, by Redis Cluster's rule: the part between its
    first ``{`` and the next ``}`` if that is not empty, else the whole name."""
    start = name.find("{")
    if start >= 0:
        end = name.find("}", start + 1)
        if end > start + 1:
            return name[start + 1:end]
    return name


def partition_of(channel: str, count: int) -> int:
    """The partition a channel lives in: its hash tag's CRC-32, modulo ``count``."""
    return zlib.crc32(hash_tag(channel).encode()) % count


class Partition:
    """One partition's keys, and how far this node follows its log."""

    def __init__(self, index: int, tag: str) -> None:
        self.index = index
        self.tag = tag
        prefix = f"pushup:{{{tag}}}:"
        self.log = prefix + "log"
        self.meta = prefix + "meta"
        self.channels = prefix + "channels"
        self.foreign = prefix + "foreign"
        self.key = prefix + "key:"  # + the Idempotency-Key
        self.notify = prefix + "n"
        self.epoch = ""  # the log's epoch this node holds ("": none yet)
        # what the scripts add to Redis's clock, should the log need a new epoch
        self.salt = secrets.randbelow(1296)
        self.followed = False  # subscribed to, and read back after every (re)subscription
        self.ready = False  # read once since it was followed: held whole
        self.reading = False  # a read back is under way ...
        self.again = False  # ... and another must follow it
        self.waiting: list[bytes] = []  # notifications that came during the read
        self.when_ready: list[Any] = []  # Deferreds of requests waiting for it
        self.needed_by: set[str] = set()  # channels whose polls made this node follow it
        self.needed_at = 0.0  # when a request last needed it (the reactor's seconds)
        # its channels that have messages in other partitions -> those partitions
        self.abroad: dict[str, set[int]] = {}

    @property
    def origin(self) -> str:
        return f"{self.tag}.{self.epoch}"

    @staticmethod
    def epoch_of(reply: list[Any]) -> str:
        """A script's epoch (its reply's first value)."""
        epoch: str = reply[0].decode()
        return epoch


def keys_of(channel: str, partitions: int | None = None) -> Partition:
    """The keys of the partition ``channel`` lives in, with ``partitions`` of them
    (default: ``--redis-partitions``'s), to look at a channel's log in Redis."""
    count = Config().redis_partitions if partitions is None else partitions
    index = partition_of(channel, count)
    return Partition(index, partition_tags(count)[index])


