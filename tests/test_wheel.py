"""PushUp installed from a wheel runs its compiled core: a wheel install writes each
``.so`` a moment before its ``.py``, and that must not make the build look stale.

The test does what ``pip install .`` does, in two steps: ``pip wheel --no-deps`` of
a copy of this checkout (its sources, setup.py, pyproject.toml; no builds) in pip's
usual isolated build environment, whose requirements come from pip's index or
cache; then ``pip install --no-index --no-deps`` of that wheel into a fresh venv.
The venv reaches the runtime dependencies through a ``.pth`` naming this venv's
site-packages, so the install needs no index. Then ``<venv>/bin/pushup serve``
starts and answers /health, and its stderr holds only its log lines.

Wall time: the wheel's build is nearly all of it (mypyc compiles the core, pip sets
up its isolated build environment): 58 s on this 2-core machine idle, 140 s beside
other work; the venv, the install and the node take a few seconds.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

import pytest

import pushup
from pushup._build import COMPILED
from tests.toolkit import free_port

ROOT = Path(pushup.__file__).resolve().parent.parent
# The files a wheel is built from (pyproject.toml names README.md as the readme).
BUILT_FROM = ("pushup", "setup.py", "pyproject.toml", "README.md", "LICENSE")
SCRIPTS = "pushup/backplane/redis/lua"  # the Redis engine's Lua scripts, package data
# A line of the node's own text log: "<time> [<namespace>#<level>] <message>".
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\S+ \[[\w.]+#\w+\] ")


def _wheel(tmp_path: Path) -> Path:
    """A wheel of this checkout's sources, built as `pip install .` builds it."""
    source = tmp_path / "source"
    for name in BUILT_FROM:
        if (ROOT / name).is_dir():
            # no builds, nor their record (pushup/compiled.sha256): the wheel makes its own
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "*.sha256"))
        else:
            shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist),
                    str(source)], check=True, timeout=600, cwd=tmp_path)
    (wheel,) = dist.glob("pushup-*.whl")
    return wheel


def _venv_with(wheel: Path, at: Path) -> Path:
    """A fresh venv with ``wheel`` installed, no index used."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(at)], check=True,
                   timeout=120)
    python = at / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                    "--no-index", "--no-deps", str(wheel)], check=True, timeout=120)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, timeout=60, capture_output=True,
                          text=True).stdout.strip()
    # Appended after the venv's own site-packages: pushup comes from the wheel; this
    # venv's .pth files (its editable pushup) are not read from there.
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    Path(site, "dependencies.pth").write_text("".join(f"{path}\n" for path in ours))
    return at


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One wheel of this checkout for the tests of this module (its build is most
    of their time)."""
    return _wheel(tmp_path_factory.mktemp("wheel"))


@pytest.mark.timeout(900)
def test_a_wheel_install_runs_the_compiled_core_without_a_warning(tmp_path: Path,
                                                                  wheel: Path) -> None:
    venv = _venv_with(wheel, tmp_path / "venv")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PUSHUP_PURE", "PYTHONPATH")}
    node = subprocess.Popen([str(venv / "bin" / "pushup"), "serve", "--port", str(port)],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert node.stderr is not None
        stderr: list[str] = []
        while not any(" listening on " in line for line in stderr):
            line = node.stderr.readline()  # the start line is logged once listening
            assert line, f"the node exited before listening: {stderr}"
            stderr.append(line.rstrip("\n"))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as health:
            assert health.status == 200
    finally:
        node.send_signal(signal.SIGTERM)
        _, rest = node.communicate(timeout=60)
    stderr += rest.splitlines()
    (start,) = [line for line in stderr if " listening on " in line]
    assert start.endswith(f"; core compiled (mypyc, {len(COMPILED)} modules)")
    assert [line for line in stderr if not LOG_LINE.match(line)] == []


@pytest.mark.timeout(900)
def test_the_wheel_holds_every_lua_script_and_its_install_reads_them(tmp_path: Path,
                                                                     wheel: Path) -> None:
    """Each script under pushup/backplane/redis/lua/ is package data of the wheel, and
    the installed package reads every one (pushup.backplane.redis.scripts)."""
    scripts = sorted(p.name for p in (ROOT / SCRIPTS).glob("*.lua"))
    assert scripts  # the checkout has them
    with zipfile.ZipFile(wheel) as archive:
        held = sorted(PurePosixPath(name).name for name in archive.namelist()
                      if PurePosixPath(name).parent == PurePosixPath(SCRIPTS)
                      and name.endswith(".lua"))
    assert held == scripts
    venv = _venv_with(wheel, tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PUSHUP_PURE", "PYTHONPATH")}
    read = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "from pushup.backplane.redis import partitions, stream_keys, scripts\n"
         "import pushup; print(pushup.__file__)\n"
         "print(*[n + '.lua' for n in scripts.script_names() if scripts.read_script(n)])"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=True)
    where, names = read.stdout.splitlines()
    assert not Path(where).is_relative_to(ROOT)  # the installed package, not the checkout
    assert names.split() == scripts
