"""The opaque cursor: how far a client has read, per origin.

A cursor maps each origin (a node id plus boot epoch) to the highest sequence
number of that origin the client has been answered past. It never holds a
wall-clock time, so a message that reaches a node late from a peer can never
fall behind a cursor, and merging only ever moves positions forward. This
module is pure: it encodes, decodes and merges, nothing else.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pushup.core.errors import BadRequest

PREFIX = "c1."  # a cursor never parses as a number: "c" is not a digit
MAX_ORIGINS = 1024
_ORIGIN = re.compile(r"[A-Za-z0-9_-]{1,64}\.[0-9a-z]{1,16}")


@dataclass(frozen=True, slots=True)
class Cursor:
    """Per-origin positions; an origin that is absent is at position 0."""

    positions: tuple[tuple[str, int], ...]  # sorted by origin, positions > 0

    @classmethod
    def of(cls, positions: Mapping[str, int]) -> Cursor:
        return cls(tuple(sorted((o, s) for o, s in positions.items() if s > 0)))

    def position(self, origin: str) -> int:
        for o, seq in self.positions:
            if o == origin:
                return seq
        return 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.positions)

    def advanced(self, updates: Iterable[tuple[str, int]]) -> Cursor:
        """This cursor with each given position raised, never lowered."""
        merged = dict(self.positions)
        for origin, seq in updates:
            if seq > merged.get(origin, 0):
                merged[origin] = seq
        return Cursor.of(merged)

    def encode(self) -> str:
        text = ";".join(f"{o}:{s}" for o, s in self.positions)
        return PREFIX + base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


EMPTY = Cursor(())


def decode(token: str) -> Cursor:
    """Parse a cursor this cluster issued; 400 ``bad_parameter`` otherwise.

    What follows a second dot is not the cursor's: an event stream's ids carry
    more there, and an id is accepted wherever a cursor is.
    """
    if not token.startswith(PREFIX):
        raise BadRequest("since is neither a time nor a cursor issued by this service")
    body = token[len(PREFIX) :].partition(".")[0]  # an event stream's id goes on (http.sse)
    try:
        padded = (body + "=" * (-len(body) % 4)).encode("ascii")
        text = base64.b64decode(padded, altchars=b"-_", validate=True).decode("ascii")
    except (binascii.Error, ValueError):
        raise BadRequest("since is not a valid cursor") from None
    if not text:
        return EMPTY
    positions: dict[str, int] = {}
    parts = text.split(";")
    if len(parts) > MAX_ORIGINS:
        raise BadRequest("since is not a valid cursor")
    for part in parts:
        origin, _, seq = part.rpartition(":")
        if not _ORIGIN.fullmatch(origin) or not seq.isdigit() or len(seq) > 18:
            raise BadRequest("since is not a valid cursor")
        positions[origin] = max(positions.get(origin, 0), int(seq))
    return Cursor.of(positions)
