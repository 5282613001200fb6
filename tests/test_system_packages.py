"""deploy/system_packages.py: `make system-packages` and `make bench-packages` ask apt
only for packages whose command is missing, and apt accepts what they ask for on a
fresh image of this machine (Debian 12 with nodesource's Node.js 20 and its npm),
where asking for Debian's npm beside that nodejs was refused outright."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deploy.system_packages import NEEDS, debian_owns, missing, present

APT = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
NEEDED = sorted({what for group in NEEDS.values() for what, _ in group} | {"node"})


def _fresh_image(tmp_path: Path) -> tuple[str, str]:
    """(a PATH, a root) as a fresh image of this machine has them: the image's own
    node and npm, none of the commands or files the lead's install added."""
    commands = tmp_path / "bin"
    commands.mkdir()
    for command in ("node", "npm"):
        found = shutil.which(command)
        assert found is not None, f"this machine's image ships {command}"
        (commands / command).symlink_to(found)
    root = tmp_path / "root"
    root.mkdir()
    return str(commands), str(root)


@pytest.fixture(scope="module")
def apt_lists() -> None:
    """apt's package lists, current: what a simulated install resolves against."""
    if os.geteuid() != 0:
        pytest.skip("apt-get update needs root")
    done = subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=120", "update", "-qq"],
                          env=APT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.timeout(600)
@pytest.mark.parametrize("group", sorted(NEEDS))
def test_apt_accepts_what_a_fresh_image_of_this_machine_is_given(
        group: str, tmp_path: Path, apt_lists: None) -> None:
    path, root = _fresh_image(tmp_path)
    packages = missing(group, path=path,
                       has=lambda what, path: present(what, path, sbin=(), root=root))
    # everything the group needs but Node.js, which the image has (npm with it)
    assert packages == list(dict.fromkeys(
        package for _, package in NEEDS[group] if package not in ("nodejs", "npm")))
    done = subprocess.run(["apt-get", "install", "-s", *packages], env=APT,
                          capture_output=True, text=True, timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "Conflicts" not in said and "broken packages" not in said


def _needs_of(group: str) -> dict[str, set[str]]:
    """{package: the commands and files that show it is there}."""
    of: dict[str, set[str]] = {}
    for what, package in NEEDS[group]:
        of.setdefault(package, set()).add(what)
    return of


@given(group=st.sampled_from(sorted(NEEDS)), there=st.sets(st.sampled_from(NEEDED)),
       debians_node=st.booleans())
def test_only_packages_with_something_absent_are_named_and_never_npm_beside_a_foreign_node(
        group: str, there: set[str], debians_node: bool) -> None:
    named = missing(group, has=lambda what, path: what in there,
                    owns=lambda package: debians_node and package == "nodejs")
    wanted = [package for package, whats in _needs_of(group).items() if not whats <= there]
    if "node" in there and not debians_node:
        wanted = [package for package in wanted if package != "npm"]
    assert named == wanted


COMMANDS = [(what, package) for what, package in NEEDS["test"] if not what.startswith("/")]


@pytest.mark.parametrize("absent, package", COMMANDS)
def test_a_package_is_asked_for_exactly_when_its_command_is_not_on_the_path(
        absent: str, package: str, tmp_path: Path) -> None:
    """Real look-ups on a PATH of executables: every command the test group needs but
    one. (Debian's own node here: npm beside a foreign one is the next test's.)"""
    commands = tmp_path / "bin"
    commands.mkdir()
    for what, _ in COMMANDS:
        if what != absent:
            (commands / what).write_text("#!/bin/sh\n")
            (commands / what).chmod(0o755)
    empty = tmp_path / "root"
    empty.mkdir()
    named = missing("test", path=str(commands), owns=lambda package: True,
                    has=lambda what, path: present(what, path, sbin=(), root=str(empty)))
    # prometheus is known by its file, which the empty root lacks
    assert named == [p for p in dict.fromkeys(p for _, p in NEEDS["test"])
                     if p in (package, "prometheus")]


def test_this_machines_node_is_foreign_and_npm_is_never_asked_for_beside_it(
        tmp_path: Path) -> None:
    """This machine's Node.js is nodesource's: with it on PATH and npm hidden, Debian's
    npm (which conflicts with it) is not asked for."""
    node = shutil.which("node")
    assert node is not None and not debian_owns("nodejs")
    commands = tmp_path / "bin"
    commands.mkdir()
    (commands / "node").symlink_to(node)
    named = missing("test", path=str(commands),
                    has=lambda what, path: present(what, path, sbin=(), root=str(tmp_path)))
    assert "npm" not in named and "nodejs" not in named
