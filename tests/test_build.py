"""pushup/_build.py: the compiled core runs only when every module of it is built and
every source is the one its build recorded (by SHA-256, not by file time); else the
sources run, and ``BUILD`` says why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pushup
from pushup._build import COMPILED, INTERPRETED, compiled_of, decide, record_of, record_text
from tests.toolkit import needs_compiled

ROOT = Path(pushup.__file__).resolve().parent.parent
SUFFIX = ".cpython-311-x86_64-linux-gnu.so"
NAMES = ("pkg.a", "pkg.b")


def tree(tmp_path: Path, built: tuple[str, ...] = NAMES, recorded: bool = True) -> Path:
    """Sources, the builds named in ``built`` (newer than their sources), and the
    record of the sources that setup.py writes beside a build."""
    (tmp_path / "pkg").mkdir(parents=True)
    for name in NAMES:
        source = tmp_path / (name.replace(".", "/") + ".py")
        source.write_text(f"NAME = {name!r}\n")
        os.utime(source, (1000, 1000))
        if name in built:
            so = source.with_suffix(SUFFIX)
            so.write_bytes(b"")
            os.utime(so, (2000, 2000))
    if recorded:
        record_of(NAMES, tmp_path).write_text(record_text(NAMES, tmp_path))
    return tmp_path


@needs_compiled
def test_this_checkout_runs_the_compiled_core() -> None:
    # this machine has a C compiler: pip install -e / make build compiled it
    assert pushup.BUILD == f"compiled (mypyc, {len(COMPILED)} modules)"
    from pushup.core import errors, store
    from pushup.http import params

    assert str(store.__file__).endswith(".so") and str(params.__file__).endswith(".so")
    # stays interpreted: compiled, its exception classes would lose their `status`
    assert str(errors.__file__).endswith(".py")
    # the record beside the build is sha256sum's format, and matches the sources
    subprocess.run(["sha256sum", "--check", "--quiet", str(record_of())], cwd=ROOT,
                   check=True, timeout=60)


def test_every_module_built_from_its_present_source_is_used(tmp_path: Path) -> None:
    assert decide(NAMES, tree(tmp_path), {}) == (True, "compiled (mypyc, 2 modules)")


def test_a_source_newer_than_its_build_but_unchanged_still_uses_the_build(
        tmp_path: Path) -> None:
    """As a wheel install leaves it: each ``.so`` written just before its ``.py``."""
    root = tree(tmp_path)
    for name in NAMES:
        os.utime(root / (name.replace(".", "/") + ".py"), (3000, 3000))
    assert decide(NAMES, root, {}) == (True, "compiled (mypyc, 2 modules)")


def test_a_build_without_a_record_of_its_sources_runs_the_sources(tmp_path: Path) -> None:
    use, why = decide(NAMES, tree(tmp_path, recorded=False), {})
    assert not use and why == ("interpreted (unverified compiled build: no compiled.sha256 of "
                               "the sources it was compiled from; `make build` compiles it again)")


def test_pure_in_the_environment_runs_the_sources(tmp_path: Path) -> None:
    assert decide(NAMES, tree(tmp_path), {"PUSHUP_PURE": "1"}) == \
        (False, "interpreted (PUSHUP_PURE=1)")


def test_no_build_or_part_of_one_runs_the_sources(tmp_path: Path) -> None:
    assert decide(NAMES, tree(tmp_path, built=()), {})[1] == \
        "interpreted (no compiled build: no C compiler, or not built)"
    assert decide(NAMES, tree(tmp_path / "x", built=("pkg.a",)), {})[1] == \
        "interpreted (incomplete compiled build: pkg.b is not built)"


def test_a_source_edited_after_its_build_runs_the_sources(tmp_path: Path) -> None:
    root = tree(tmp_path)
    source = root / "pkg" / "b.py"
    source.write_text(source.read_text() + "EDITED = True\n")
    os.utime(source, (1000, 1000))  # its file time alone would not tell
    use, why = decide(NAMES, root, {})
    assert not use and why.startswith("interpreted (stale compiled build: pkg.b was edited")


def _copy_package(to: Path) -> None:
    shutil.copytree(ROOT / "pushup", to / "pushup", copy_function=shutil.copy2,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for shared in ROOT.glob("pushup__mypyc*.so"):
        shutil.copy2(shared, to / shared.name)


def _imported(root: Path) -> list[str]:
    code = ("import pushup, pushup.core.store as s, pushup.core.service; "
            "print(pushup.BUILD); print(s.__file__)")
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("PUSHUP_PURE", None)
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True,
                          text=True, timeout=60, cwd=root, env=env, check=True)
    return [*done.stdout.splitlines(), done.stderr]


@needs_compiled
def test_a_stale_build_is_never_imported(tmp_path: Path) -> None:
    """A real compiled build, one source edited after it: the sources run."""
    _copy_package(tmp_path)
    fresh, path, _ = _imported(tmp_path)
    assert fresh.startswith("compiled") and path == str(compiled_of("pushup.core.store",
                                                                    tmp_path))
    source = tmp_path / "pushup" / "core" / "hub.py"
    source.write_text(source.read_text() + "# edited\n")
    stale, path, stderr = _imported(tmp_path)
    assert stale.startswith("interpreted (stale compiled build: pushup.core.hub was edited")
    assert path == str(tmp_path / "pushup" / "core" / "store.py")
    assert "RuntimeWarning: pushup: running the interpreted (stale" in stderr


def test_without_a_c_compiler_the_build_is_the_interpreted_package() -> None:
    """setup.py compiles nothing and says so in one line (pip then installs the sources)."""
    env = {**os.environ, "CC": "/nonexistent/cc"}
    done = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == pushup.__version__
    assert [line for line in done.stderr.splitlines() if line.startswith("pushup build:")] == \
        ["pushup build: interpreted: no C compiler (/nonexistent/cc)"]


def test_every_module_of_the_compilable_layers_is_compiled_or_says_why_not() -> None:
    """core/ and http/ are the layers mypyc compiles: a module added to either
    must join COMPILED or name its reason in INTERPRETED, never both."""
    layers = [ROOT / "pushup" / "core", ROOT / "pushup" / "http"]
    modules = {f"pushup.{p.parent.name}.{p.stem}" for layer in layers
               for p in layer.glob("*.py") if p.stem != "__init__"}
    assert set(COMPILED) & set(INTERPRETED) == set()
    assert modules - set(COMPILED) - set(INTERPRETED) == set()
    assert set(INTERPRETED) - modules == set()  # no reason kept for a module that is gone
    assert all(reason.strip() for reason in INTERPRETED.values())
