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
- some source is not the one its build was compiled from (edited, or checked
  out, since the last ``make build``): interpreted, with a warning, so an edit
  is never shadowed by a stale build.

How a build is verified: ``setup.py`` records the SHA-256 of each source it
compiles in ``pushup/compiled.sha256`` (``RECORD``; ``sha256sum -c`` reads it), in
place and in the wheel alike; at import the sources are hashed again (~0.6 ms) and
must match. File times are never compared: a wheel install writes each ``.so``
just before its ``.py``. A build without a record runs interpreted, with a warning.

When they may not be used, a finder placed first on ``sys.meta_path`` loads
the ``.py`` source of each module of ``COMPILED``. ``BUILD`` says which runs
and why; ``pushup --version``, ``/stats`` and a log line once listening show it.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# The modules mypyc compiles: the pure core's values, clock, cursor, store (and the
# views a reader has of it, read per poll), hub and service, and the HTTP front's
# protocol, factory, request being read, phases, query parsing, response framing and
# endpoints; and ``ops.timing``, which times every request on its way to the
# endpoints. Every other module of the two layers that could be compiled (core/,
# http/) is in ``INTERPRETED``, with its reason; tests/test_build.py fails on a
# module of theirs that is in neither.
COMPILED = (
    "pushup.core.changes",
    "pushup.core.channels",
    "pushup.core.clock",
    "pushup.core.counters",
    "pushup.core.cursor",
    "pushup.core.hub",
    "pushup.core.image",
    "pushup.core.model",
    "pushup.core.origins",
    "pushup.core.runs",
    "pushup.core.service",
    "pushup.core.store",
    "pushup.core.views",
    "pushup.http.exchange",
    "pushup.http.flow",
    "pushup.http.framing",
    "pushup.http.front",
    "pushup.http.handlers",
    "pushup.http.incoming",
    "pushup.http.params",
    "pushup.http.phase",
    "pushup.http.protocol",
    "pushup.ops.timing",
)
# What stays interpreted, and why (as black keeps its exclusions).
INTERPRETED = {
    "pushup.core.errors": "a compiled exception class loses its class-level status and code",
    "pushup.core.idempotency": "Replayed subclasses list, which mypyc cannot compile",
    "pushup.core.follow": "values and one rule, per batch or log page, called from "
                          "Service.follow: nothing per delivery",
    "pushup.http.render": "called once per distinct answer of a fan-out, not per "
                          "subscriber; not measured compiled yet",
    "pushup.http.sse": "an event stream's framing, once per event per stream; not "
                       "measured compiled yet",
    "pushup.http.tokens": "PyJWT does the work; once per authorised request",
    "pushup.core.stream_values": "Durable Streams' values and header checks (issue 30): "
                                 "not measured compiled yet",
    "pushup.http.streams": "Durable Streams' endpoints (issue 30): not measured compiled yet",
    "pushup.core.streams": "Durable Streams' streams and decisions (issue 30): not measured "
                           "compiled yet",
    "pushup.core.stream": "one Durable Stream, its reads and waiters (issue 36, split from "
                          "core.streams): not measured compiled yet",
    "pushup.core.stream_budget": "what a Durable Stream is charged, once per create or append: "
                                 "not measured compiled yet",
    "pushup.core.stream_state": "a Durable Stream as kept (--data-dir, Redis), once per write "
                                "or read back: not measured compiled yet",
    "pushup.http.stream_headers": "Durable Streams' header names and error fields: constants "
                                  "and one function per refused request",
    "pushup.http.stream_sse": "a Durable Stream's SSE feed (issue 30): not measured compiled "
                              "yet",
    "pushup.http.stream_polls": "a Durable Stream's held long polls (issue 30): once per "
                                "group of polls and once per poll answered; not measured "
                                "compiled yet",
    "pushup.http.stream_retention": "a Durable Stream's retention headers (issue 39): once "
                                    "per creation or HEAD",
    "pushup.http.upgrade": "runs once per peer link",
    "pushup.http.stream_drain": "the open event streams' set, and their ends spread once "
                                "per drain (issue 40)",
    "pushup.http.seams": "typing Protocols only: nothing runs",
    "pushup.core.presence": "presence (issue 38, only with --presence): once per poll "
                            "counted; not measured compiled yet",
    "pushup.core.subscriptions": "Durable Streams' subscriptions (issue 39, §6-7): once per "
                                 "subscription request or wake, not per delivery",
    "pushup.http.stream_subscriptions": "the __ds/ subscription endpoints (issue 39): once "
                                        "per subscription request",
    "pushup.core.roster": "presence (issue 38): once per membership change and once per "
                          "turn for the counts; not measured compiled yet",
    "pushup.http.presence": "presence (issue 38): PyJWT reads a token's claims; once per "
                            "poll counted; not measured compiled yet",
    "pushup.http.presence_followers": "presence (issue 38): the polls and streams counted, "
                                      "once per poll; not measured compiled yet",
}
PURE_ENV = "PUSHUP_PURE"
ROOT = Path(__file__).resolve().parent.parent  # the folder that holds ``pushup/``
# In the top package's folder: the SHA-256 of each source the build beside it was
# compiled from, one ``<hex>  <path from ROOT>`` line each (``sha256sum -c`` reads it).
RECORD = "compiled.sha256"


def source_of(name: str, root: Path = ROOT) -> Path:
    return root.joinpath(*name.split(".")).with_suffix(".py")


def record_of(names: Sequence[str] = COMPILED, root: Path = ROOT) -> Path:
    return root / names[0].split(".")[0] / RECORD


def digests(names: Sequence[str] = COMPILED, root: Path = ROOT) -> dict[str, str]:
    """{source path from ``root``: its SHA-256}, of the sources as they are now."""
    return {source_of(name, root).relative_to(root).as_posix():
            hashlib.sha256(source_of(name, root).read_bytes()).hexdigest() for name in names}


def record_text(names: Sequence[str] = COMPILED, root: Path = ROOT) -> str:
    """What setup.py writes to ``RECORD`` beside a build of these sources."""
    return "".join(f"{digest}  {path}\n" for path, digest in digests(names, root).items())


def recorded(names: Sequence[str] = COMPILED, root: Path = ROOT) -> dict[str, str] | None:
    """{source path from ``root``: its SHA-256} as the build recorded them, if it did."""
    try:
        text = record_of(names, root).read_text()
    except OSError:
        return None
    return {path: digest for digest, _, path in
            (line.partition("  ") for line in text.splitlines())}


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
    record = recorded(names, root)
    if record is None:
        return False, (f"interpreted (unverified compiled build: no {RECORD} of the sources "
                       f"it was compiled from; `make build` compiles it again)")
    now = digests(names, root)
    for name in names:
        path = source_of(name, root).relative_to(root).as_posix()
        if record.get(path) != now[path]:
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
        if any(flaw in build for flaw in ("stale", "incomplete", "unverified")):
            warnings.warn(f"pushup: running the {build}", RuntimeWarning, stacklevel=2)
    return build

