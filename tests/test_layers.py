"""The layers' import rule, as the README's code map draws it.

``core`` imports only ``core``; ``config`` only ``core``; ``http`` imports
``core``, ``config`` and the backplane seam; each backplane imports ``core``,
``config``, the seam and its own folder; only ``ops`` imports everything.
Nothing under ``core/`` or ``http/`` imports the reactor. ``_twisted`` and
``_libc`` (the guarded private reaches) serve any layer that does I/O.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pushup"
SHARED = ("pushup._twisted", "pushup._libc")
ALLOWED = {  # a module's layer -> the prefixes it may import from pushup
    "pushup.core": ("pushup.core",),
    "pushup.config": ("pushup.core", "pushup.config"),
    "pushup.http": ("pushup.core", "pushup.config", "pushup.http", "pushup.backplane:seam",
                    *SHARED),
    "pushup.backplane.disk": ("pushup.core", "pushup.config", "pushup.backplane:seam"),
    "pushup.backplane.mesh": ("pushup.core", "pushup.config", "pushup.backplane:seam",
                              "pushup.backplane.mesh", *SHARED),
    "pushup.backplane.redis": ("pushup.core", "pushup.config", "pushup.backplane:seam",
                               "pushup.backplane.redis", *SHARED),
    "pushup.backplane": ("pushup.core", "pushup.config", "pushup.backplane:seam"),
    "pushup.ops": ("pushup",),
    "pushup.__main__": ("pushup.ops",),
    "pushup.client": ("pushup.client",),  # pushup-client, installed apart: no server layer
}
NO_REACTOR = ("pushup.core", "pushup.http")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports(path: Path) -> list[str]:
    """The modules ``path`` imports: ``from a import b`` is ``a.b`` when that is
    a module of ours, else ``a``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.append(name if is_module(name) else node.module)
    return found


def allowed(importer: str, imported: str) -> bool:
    layer = max((k for k in ALLOWED if importer == k or importer.startswith(k + ".")), key=len)
    for prefix in ALLOWED[layer]:
        if prefix == "pushup.backplane:seam":
            if imported == "pushup.backplane":
                return True
        elif imported == prefix or imported.startswith(prefix + "."):
            return True
    return False


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if module_name(p) not in ("pushup",
                                                                            "pushup._twisted",
                                                                            "pushup._libc"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: module_name(p))
def test_a_module_imports_only_the_layers_beneath_it(path: Path) -> None:
    importer = module_name(path)
    ours = {name for name in imports(path) if name.split(".")[0] == "pushup"}
    wrong = sorted(name for name in ours if not allowed(importer, name))
    assert not wrong, f"{importer} may not import {wrong}"


@pytest.mark.parametrize("path", [p for p in MODULES if module_name(p).startswith(NO_REACTOR)],
                         ids=lambda p: module_name(p))
def test_core_and_http_never_import_the_reactor(path: Path) -> None:
    reactor = [name for name in imports(path) if name.startswith("twisted.internet.reactor")
               or name == "twisted.internet.reactor"]
    assert not reactor, f"{module_name(path)} imports the reactor"


def test_the_rule_catches_a_core_module_importing_http() -> None:
    assert not allowed("pushup.core.store", "pushup.http.exchange")
    assert not allowed("pushup.http.handlers", "pushup.backplane.mesh.wire")
    assert allowed("pushup.http.handlers", "pushup.backplane")
    assert allowed("pushup.backplane.mesh.peers", "pushup.backplane.mesh.wire")
    assert not allowed("pushup.backplane.redis.engine", "pushup.backplane.mesh.wire")
    assert not allowed("pushup.client.sync", "pushup.core.errors")
    assert allowed("pushup.client.sync", "pushup.client.values")
