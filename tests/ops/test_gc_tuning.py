"""``pushup serve`` tunes the garbage collector once serving (pushup.ops.cli.tune_gc):
the objects built to start are frozen out of collections and the young
generation is 50,000 objects. Run in a fresh interpreter: freezing is global."""

from __future__ import annotations

import subprocess
import sys


def test_tune_gc_freezes_what_started_and_raises_the_young_threshold() -> None:
    code = ("import gc; from pushup.ops.cli import GC_YOUNG, tune_gc; "
            "before = gc.get_freeze_count(); tune_gc(); "
            "print(before, gc.get_freeze_count() > 1000, gc.get_threshold() == (GC_YOUNG, 50, 50))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, check=True)
    assert out.stdout.split() == ["0", "True", "True"]

