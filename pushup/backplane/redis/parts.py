"""What the parts of the Redis engine share: ``RedisEngine`` and the three it
puts together (``publishing``, ``interest``, ``reader``) work with the same
node's service and store, the same Redis (``Shards``), the same K partitions, the
same clock and the same time Redis has to answer.

The rule: these are set once, when the engine is made, and every part finds a
channel's partition the same way (``partition``). This module sends nothing and
decides nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pushup.backplane.redis.cluster import Shards
from pushup.backplane.redis.following import Partition
from pushup.backplane.redis.partitions import partition_of
from pushup.core.service import Service


class EnginePart:
    """A part of the Redis engine: its collaborators, and where a channel lives."""

    def __init__(self, service: Service, shards: Shards, partitions: Sequence[Partition],
                 clock: Any, *, timeout: float) -> None:
        self.service = service
        self.store = service.store
        self.shards = shards
        self.partitions = partitions
        self.clock = clock
        self.timeout = timeout  # seconds Redis has to answer a command

    def partition(self, channel: str) -> Partition:
        """The partition ``channel`` lives in."""
        return self.partitions[partition_of(channel, len(self.partitions))]
