"""Build PushUp: the package as pyproject.toml describes it, plus the modules of
``pushup._build.COMPILED`` compiled with mypyc from the same sources, where a C
compiler exists. Without one (or with ``PUSHUP_PURE=1``), or if compiling fails,
the interpreted package is installed and one line says so; ``import pushup``
then runs the sources (pushup/_build.py).

``make build`` (run by ``make run`` and ``make test``) compiles in place again
when a compiled source changed: ``python setup.py build_ext --inplace``.

Beside each build (in place, and in the wheel) goes ``pushup/compiled.sha256``,
the SHA-256 of each source compiled, hashed before mypyc reads it: ``import pushup``
uses the build only while every source still matches it (pushup/_build.py).
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
BUILD = runpy.run_path(str(HERE / "pushup" / "_build.py"))
# The sources as mypyc reads them (it translates them when ``extensions()`` runs):
# what a build records, so that a source edited during the build is not taken as built.
SOURCES = BUILD["record_text"](BUILD["COMPILED"], HERE)


def say(line: str) -> None:
    print(f"pushup build: {line}", file=sys.stderr, flush=True)


def compiler() -> str | None:
    """Why the core cannot be compiled here, or None if it can."""
    if os.environ.get(BUILD["PURE_ENV"]) == "1":
        return f"{BUILD['PURE_ENV']}=1"
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        return "no Python headers (Python.h)"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc (pip install mypy) is not installed"
    return None


def extensions() -> list[object]:
    why = compiler()
    if why is not None:
        say(f"interpreted: {why}")
        return []
    from mypyc.build import mypycify

    sources = [str(Path(*name.split(".")).with_suffix(".py")) for name in BUILD["COMPILED"]]
    # Its own mypy settings: the build environment need not have the packages
    # the sources import (their types are Any to mypyc), nor mypy's plugins.
    options = ["--config-file", os.devnull, "--ignore-missing-imports", "--python-version",
               f"{sys.version_info.major}.{sys.version_info.minor}"]
    try:
        return list(mypycify([*options, *sources], opt_level="3", group_name="pushup"))
    except BaseException as e:  # mypy's errors end in SystemExit
        say(f"interpreted: mypyc could not translate the core ({e!r})")
        return []


class OptionalBuildExt(build_ext):
    """Compile the core; if that fails, install the interpreted package instead."""

    def run(self) -> None:
        if not self.extensions:
            return
        # Where builds go: the build folder (a wheel's contents), and the sources'
        # folder too when in place (`pip install -e`, `make build`).
        roots = [Path(self.build_lib), *([HERE] if self.inplace else [])]
        try:
            super().run()
        except Exception as e:  # a compiler or linker error
            for ext in self.extensions:
                built = Path(self.get_ext_fullpath(ext.name))
                built.unlink(missing_ok=True)
            for root in roots:
                BUILD["record_of"](BUILD["COMPILED"], root).unlink(missing_ok=True)
            say(f"interpreted: compiling failed ({e})")
            return
        for root in roots:
            path = BUILD["record_of"](BUILD["COMPILED"], root)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(SOURCES)
        say(f"compiled: {len(BUILD['COMPILED'])} modules with mypyc")


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
