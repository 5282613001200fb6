"""The one place PushUp calls the C library (glibc's allocator, through ctypes).

Memory Python frees goes back to malloc, not to the system: after a burst of
large answers glibc keeps the freed pages in its heap, and the process's RSS
stays at the burst's peak. ``release_free_memory`` hands them back
(``malloc_trim``) when a good deal is free. Where glibc is absent (musl,
macOS) every function here is a no-op: PushUp behaves the same, minus this.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

TRIM_SLACK = 16 * 1024 * 1024  # free heap bytes glibc may keep without a trim


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def _load() -> Any:
    """glibc (2.33 or later, for ``mallinfo2``), or None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - glibc, not another libc
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_glibc = _load()


def heap_usage() -> tuple[int, int] | None:
    """(bytes in use, bytes free) in malloc's heaps, mmapped blocks aside;
    None without glibc."""
    if _glibc is None:
        return None
    info = _glibc.mallinfo2()
    return info.uordblks, info.fordblks


def release_free_memory(slack: int = TRIM_SLACK) -> bool:
    """Give malloc's free pages back to the system when more than ``slack``
    bytes, and more than are in use, are free; True if it trimmed.

    The test keeps a node under steady load from trimming (and re-faulting)
    its working set every time; after a burst has gone, free dwarfs in use.
    A trim costs a few milliseconds for a heap of 100 MB.
    """
    usage = heap_usage()
    if usage is None:
        return False
    in_use, free = usage
    if free <= slack or free <= in_use:
        return False
    _glibc.malloc_trim(0)
    return True
