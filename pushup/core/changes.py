"""What changed in a store since its journal last wrote it down.

The store notes each message, channel and origin it changes; a journal (the
data directory, :mod:`pushup.backplane.disk`) writes them all in one transaction at
the end of the reactor turn, then clears the record. A store without a
journal notes into ``NO_CHANGES``, which keeps nothing. Keys only, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pushup.core.idempotency import Remembered
from pushup.core.model import Message


class Changes:
    """What changed in a Store since a journal last wrote it down.

    Keys only point at the store's live state: a journal reads the current
    message, channel or origin when it writes (a message no channel holds any
    more is deleted, so is a channel the store no longer has). ``on_first``
    runs when the first change comes in after :meth:`clear`, so the journal
    can schedule one write for everything one reactor turn changes.
    """

    __slots__ = ("channels", "keys", "messages", "on_first", "origins")

    def __init__(self, on_first: Callable[[], None]) -> None:
        self.on_first = on_first
        self.messages: dict[str, Message] = {}  # id -> message
        self.channels: set[str] = set()
        self.origins: set[str] = set()
        self.keys: list[Remembered] = []  # keyed publishes (written once: never change)

    def __bool__(self) -> bool:
        return bool(self.messages or self.channels or self.origins or self.keys)

    def message(self, m: Message, channels: Iterable[str] = ()) -> None:
        """``m`` changed (stored, or let go of), and with it ``channels``."""
        if not self:
            self.on_first()
        self.messages[m.id] = m
        self.channels.update(channels)

    def channel(self, name: str) -> None:
        if not self:
            self.on_first()
        self.channels.add(name)

    def origin(self, name: str) -> None:
        if not self:
            self.on_first()
        self.origins.add(name)

    def key(self, record: Remembered) -> None:
        if not self:
            self.on_first()
        self.keys.append(record)

    def clear(self) -> None:
        self.keys = []
        self.messages = {}
        self.channels = set()
        self.origins = set()


class _NoChanges(Changes):
    """The journal of a store nobody writes down: every note is dropped."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(lambda: None)

    def message(self, m: Message, channels: Iterable[str] = ()) -> None:
        pass

    def channel(self, name: str) -> None:
        pass

    def origin(self, name: str) -> None:
        pass

    def key(self, record: Remembered) -> None:
        pass


NO_CHANGES: Changes = _NoChanges()
