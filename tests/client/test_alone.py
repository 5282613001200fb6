"""pushup.client stands alone: its modules import only the standard library,
httpx, PyJWT and pushup.client itself, never the server (no Twisted, no core),
so the pushup-client distribution (clients/python) needs nothing else.

tests/test_layers.py walks pushup/ and does not follow the symlink pushup/client,
so this walks the client's sources where they live."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "python" / "pushup" / "client"
THIRD_PARTY = {"httpx", "jwt"}  # the distribution's dependencies: httpx, pyjwt


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_the_server_package_holds_the_same_client() -> None:
    link = CLIENT.parents[3] / "pushup" / "client"
    assert link.is_symlink() and link.resolve() == CLIENT


@pytest.mark.parametrize("path", sorted(CLIENT.glob("*.py")), ids=lambda p: p.name)
def test_a_client_module_imports_nothing_of_the_server(path: Path) -> None:
    outside = {name for name in imported(path)
               if name.split(".")[0] not in sys.stdlib_module_names | THIRD_PARTY
               and not (name == "pushup.client" or name.startswith("pushup.client."))}
    assert outside == set(), f"{path.name} imports {sorted(outside)}"
