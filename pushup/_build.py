"""Which build of the core runs: compiled with mypyc, or the interpreted sources.

``setup.py`` compiles the modules named in ``COMPILED`` with mypyc, from the
same ``.py`` files, where a C compiler exists; each compiled module is an
extension module next to its source, which Python imports in preference to
the source. This module (stdlib only: ``setup.py`` reads ``COMPILED`` from it
without importing the package) decides, when ``pushup`` is imported, whether
those extension modules may be used:

- ``PUSHUP_PURE=1`` in the environment: never (profiling, the interpreted
  test run);
- some module has no compiled build: the whole set runs interpreted (a
  compiled module calls the others' compiled code directly, so the set is
  used whole or not at all);
- some source is newer than its compiled build (edited, or checked out,
  since the last ``make build``): interpreted, with a warning, so an edit is
  never shadowed by a stale build.

When they may not be used, a finder placed first on ``sys.meta_path`` loads
the ``.py`` source of each module of ``COMPILED``. ``BUILD`` says which runs
and why; ``pushup --version``, ``/stats`` and a log line once listening show it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# The modules mypyc compiles: the pure core's values, cursor, store and hub,
# and the HTTP front's protocol, query parsing and response framing. Not ``errors``
# (compiled exception subclasses lose their class-level ``status``), not
# ``idempotency`` (``Replayed`` subclasses ``list``), not ``service`` or
# ``handlers`` (tests count calls by replacing a method on them).
COMPILED = (
    "pushup.core.changes",
    "pushup.core.channels",
    "pushup.core.counters",
    "pushup.core.cursor",
    "pushup.core.hub",
    "pushup.core.image",
    "pushup.core.model",
    "pushup.core.origins",
    "pushup.core.runs",
    "pushup.core.store",
    "pushup.http.exchange",
    "pushup.http.params",
    "pushup.http.protocol",
)
PURE_ENV = "PUSHUP_PURE"
ROOT = Path(__file__).resolve().parent.parent  # the folder that holds ``pushup/``


def source_of(name: str, root: Path = ROOT) -> Path:
    return root.joinpath(*name.split(".")).with_suffix(".py")


def compiled_of(name: str, root: Path = ROOT) -> Path | None:
    """The extension module built for ``name``, if there is one."""
    source = source_of(name, root)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


def decide(names: Sequence[str] = COMPILED, root: Path = ROOT,
           environ: dict[str, str] | os._Environ[str] = os.environ) -> tuple[bool, str]:
    """(whether the compiled modules may be used, what runs and why)."""
    if environ.get(PURE_ENV) == "1":
        return False, f"interpreted ({PURE_ENV}=1)"
    built = {name: compiled_of(name, root) for name in names}
    missing = [name for name, path in built.items() if path is None]
    if len(missing) == len(names):
        return False, "interpreted (no compiled build: no C compiler, or not built)"
    if missing:
        return False, f"interpreted (incomplete compiled build: {missing[0]} is not built)"
    for name, path in built.items():
        assert path is not None
        if source_of(name, root).stat().st_mtime > path.stat().st_mtime:
            return False, (f"interpreted (stale compiled build: {name} was edited since; "
                           f"`make build` compiles it again)")
    return True, f"compiled (mypyc, {len(names)} modules)"


class SourceFinder:
    """Loads the ``.py`` source of the modules in ``names``, never their builds."""

    def __init__(self, names: Sequence[str], root: Path) -> None:
        self.names = frozenset(names)
        self.root = root

    def find_spec(self, fullname: str, path: object = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        return importlib.util.spec_from_file_location(fullname, source_of(fullname, self.root))


def choose(names: Sequence[str] = COMPILED, root: Path = ROOT) -> str:
    """Decide, and make sure the interpreted sources load when they must."""
    use, build = decide(names, root)
    if not use:
        if not any(isinstance(f, SourceFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, SourceFinder(names, root))
        if "stale" in build or "incomplete" in build:
            warnings.warn(f"pushup: running the {build}", RuntimeWarning, stacklevel=2)
    return build

