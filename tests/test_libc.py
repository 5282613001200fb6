"""pushup/_libc.py: freed heap memory goes back to the system, and nothing
happens where glibc is absent."""

from __future__ import annotations

import pytest

from pushup import _libc
from pushup.ops.metrics import rss_bytes

glibc = pytest.mark.skipif(_libc.heap_usage() is None, reason="needs glibc 2.33+")


@glibc
def test_a_heap_left_mostly_free_is_trimmed():
    # 64 KB objects come from the heap (below malloc's mmap threshold); the
    # last one, allocated after, pins the heap's top so free() alone can't
    # shrink it.
    blocks = [bytes(64 * 1024) for _ in range(800)]
    pin = bytes(64 * 1024)
    del blocks
    in_use, free = _libc.heap_usage()  # type: ignore[misc]
    assert free > 40 * 1024 * 1024 and free > in_use
    before = rss_bytes()
    assert _libc.release_free_memory() is True
    assert before - rss_bytes() > 30 * 1024 * 1024  # the freed pages left the process
    assert pin  # kept alive across the trim


@glibc
def test_a_heap_with_less_free_than_the_slack_is_left_alone():
    assert _libc.release_free_memory(slack=1 << 62) is False


def test_without_glibc_everything_is_a_no_op(monkeypatch):
    monkeypatch.setattr(_libc, "_glibc", None)
    assert _libc.heap_usage() is None
    assert _libc.release_free_memory(slack=0) is False
