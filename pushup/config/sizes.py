"""A byte size as an operator writes it: ``1048576``, ``256MiB``, ``64 KiB``, ``1.5GiB``,
``512KB``. This module turns such text into a number of bytes, or says why it cannot.

The units are those the README and docs/api.md write: IEC ``KiB``, ``MiB``, ``GiB``,
``TiB`` (powers of 1024) and SI ``kB``/``KB``, ``MB``, ``GB``, ``TB`` (powers of 1000),
and ``B``; letter case does not matter. A bare ``K``, ``M`` or ``G`` is refused with
both readings named: ``256M`` means 256 MiB to systemd and 256 MB to a disk maker,
and a limit off by 5 % is found only in production. A fraction must come to whole
bytes (``1.5KiB`` is 1536; ``1.5B`` is refused). Nothing here reads a file or the
environment; :mod:`pushup.config` calls :func:`parse_size` for each ``*_bytes`` setting.
"""

from __future__ import annotations

import re
from fractions import Fraction

UNITS: dict[str, int] = {
    "b": 1,
    "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4,
    "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
}
# The unit letters alone, which two conventions read differently.
AMBIGUOUS = {"k": "Ki", "m": "Mi", "g": "Gi", "t": "Ti"}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(value: object) -> int:
    """The number of bytes ``value`` names: an int (a TOML integer) as it is, or text
    of a number with an optional unit. Raises ValueError with a one-line reason an
    operator can act on (the caller names where the value was given)."""
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes, or one with a unit such as 256MiB")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{value!r} is not a whole number of bytes")
        return int(value)
    if not isinstance(value, str):
        raise ValueError("a size is a number of bytes, or one with a unit such as 256MiB")
    match = _SIZE.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not a size: write bytes, or a number with a unit "
                         f"({', '.join(_spelled())}), e.g. 256MiB")
    number, unit = Fraction(match.group(1)), match.group(2).lower()
    if unit in AMBIGUOUS:
        letter = match.group(2)
        raise ValueError(f"{value!r}: {letter} alone is ambiguous; write "
                         f"{match.group(1)}{AMBIGUOUS[unit]}B (powers of 1024) or "
                         f"{match.group(1)}{letter.upper()}B (powers of 1000)")
    if unit and unit not in UNITS:
        raise ValueError(f"{value!r}: unknown unit {match.group(2)!r} (one of "
                         f"{', '.join(_spelled())})")
    size = number * UNITS.get(unit, 1)
    if size.denominator != 1:
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(size)


def _spelled() -> list[str]:
    """The units as the docs write them."""
    return ["B", "KiB", "MiB", "GiB", "TiB", "kB", "MB", "GB", "TB"]
