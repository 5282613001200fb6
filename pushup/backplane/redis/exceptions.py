"""What can go wrong with a Redis command, as exception types, and the one table
that turns Redis's error replies into them (redis-py's ``EXCEPTION_CLASSES``).

The rule, errors by origin: ``RedisError`` is Redis's own error reply (the
connection is fine), typed by its first word through ``REPLY_ERRORS``
(``MOVED``, ``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``, ``LOADING``, ``NOSCRIPT``, and
the words our scripts answer with, ``EXISTS`` and ``REUSED``); any other word is a
plain ``RedisError``. ``RedisGone`` means no reply will come (the command may or
may not have run), ``RedisTimeout`` is the ``RedisGone`` of a command that outlived
its ``timeout``, and ``RedisNotSent`` the ``RedisGone`` of a command never written
(it cannot have run). Only ``reply_error`` reads an error reply's words; every
other module tells errors apart by type. Values only: nothing here sends.
"""

from __future__ import annotations

from typing import Final


class RedisError(Exception):
    """Redis answered this command with an error reply, e.g. ``NOSCRIPT No matching...``;
    ``message`` is the whole reply, its first word included."""

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class Redirected(RedisError):
    """The command went to a node that does not serve its slot now: it did not run
    there; ``slot`` and the ``address`` (host:port) to send it to."""

    @property
    def slot(self) -> int:
        return int(self.message.split(" ")[1])

    @property
    def address(self) -> str:
        return self.message.split(" ")[2]


class Moved(Redirected):
    """``MOVED <slot> <address>``: the slot lives there now (the map is stale)."""


class Ask(Redirected):
    """``ASK <slot> <address>``: this key only, once, at a node importing the slot."""


class TryAgain(RedisError):
    """``TRYAGAIN``: a multi-key command whose keys a slot migration has split."""


class ClusterDown(RedisError):
    """``CLUSTERDOWN``: the cluster does not serve this slot now."""


class Loading(RedisError):
    """``LOADING``: Redis is loading its data set and answers nothing else yet."""


class NoScript(RedisError):
    """``NOSCRIPT``: Redis does not hold the script an EVALSHA named."""


class ScriptRefused(RedisError):
    """One of our scripts refused a write before writing anything."""


class ChannelExists(ScriptRefused):
    """``EXISTS <channel>``: a create named an explicit channel that exists."""

    @property
    def channel(self) -> str:
        return self.message.partition(" ")[2]


class KeyReused(ScriptRefused):
    """``REUSED ...``: an Idempotency-Key used in this epoch for another body."""


# An error reply's first word -> its type (any other: RedisError).
REPLY_ERRORS: Final[dict[str, type[RedisError]]] = {
    "MOVED": Moved,
    "ASK": Ask,
    "TRYAGAIN": TryAgain,
    "CLUSTERDOWN": ClusterDown,
    "LOADING": Loading,
    "NOSCRIPT": NoScript,
    "EXISTS": ChannelExists,
    "REUSED": KeyReused,
}


def reply_error(message: str) -> RedisError:
    """The exception an error reply ``message`` is (``REPLY_ERRORS``): what the
    reply parser makes of every error reply, an error inside an array too."""
    word = message.partition(" ")[0]
    return REPLY_ERRORS.get(word, RedisError)(message)


class RedisGone(Exception):
    """No reply will come: not connected, or the connection went while waiting."""


class RedisTimeout(RedisGone):
    """No reply within the command's ``timeout``; the connection was dropped for it."""


class RedisNotSent(RedisGone):
    """Not connected when the command was issued: it was never written, so never ran."""
