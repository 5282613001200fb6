"""The layers' import rule, as the README's code map draws it.

``core`` imports only ``core``; ``config`` only ``core``; ``http`` imports
``core``, ``config`` and the backplane seam; each backplane imports ``core``,
``config``, the seam and its own folder; only ``ops`` imports everything.
Nothing under ``core/`` or ``http/`` imports the reactor. ``_twisted`` and
``_libc`` (the guarded private reaches) serve any layer that does I/O.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pushup"
SHARED = ("pushup._twisted", "pushup._libc")
# The seam every layer above the engines may import: the Backplane, and beside it
# the StreamEngine (as centrifuge's MapBroker beside its Broker).
SEAM = ("pushup.backplane", "pushup.backplane.stream_engine")
LINKS = "pushup.backplane.links"  # the link toolkit every engine shares
ALLOWED = {  # a module's layer -> the prefixes it may import from pushup
    "pushup.core": ("pushup.core",),
    "pushup.config": ("pushup.core", "pushup.config"),
    "pushup.http": ("pushup.core", "pushup.config", "pushup.http", "pushup.backplane:seam",
                    *SHARED),
    "pushup.backplane.disk": ("pushup.core", "pushup.config", "pushup.backplane:seam"),
    "pushup.backplane.mesh": ("pushup.core", "pushup.config", "pushup.backplane:seam",
                              "pushup.backplane.mesh", LINKS, *SHARED),
    "pushup.backplane.redis": ("pushup.core", "pushup.config", "pushup.backplane:seam",
                               "pushup.backplane.redis", LINKS, *SHARED),
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
            if imported in SEAM:
                return True
        elif imported == prefix or imported.startswith(prefix + "."):
            return True
    return False


def sources() -> list[Path]:
    """Every module file of the package, through symlinked folders too (pushup/client
    is one: Path.rglob does not follow it, and the client's rule was never checked)."""
    return sorted(Path(folder, name) for folder, _, names in os.walk(PACKAGE, followlinks=True)
                  for name in names if name.endswith(".py"))


MODULES = [p for p in sources() if module_name(p) not in ("pushup", "pushup._twisted",
                                                          "pushup._libc")]


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
    assert allowed("pushup.http.streams", "pushup.backplane.stream_engine")
    assert not allowed("pushup.http.streams", "pushup.backplane.redis.streams")
    assert allowed("pushup.backplane.mesh.peers", "pushup.backplane.mesh.wire")
    assert not allowed("pushup.backplane.redis.engine", "pushup.backplane.mesh.wire")
    assert not allowed("pushup.client.sync", "pushup.core.errors")
    assert allowed("pushup.client.sync", "pushup.client.values")


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (``TYPE_CHECKING`` imports
    too: a cycle there is a cycle of the design)."""
    graph: dict[str, set[str]] = {}
    for path in sources():
        name = module_name(path)
        graph[name] = {i for i in imports(path) if i.split(".")[0] == "pushup" and i != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph``: its strongly connected components of more
    than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_takes_part_in_an_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# "peer" or "mesh" starting a word (PeerLink, peer_refused, /peer/, PEER_...), not
# inside one (TypeError).
MESH_WORD = re.compile(r"(?<![a-z])(?:[Pp]eer|PEER|[Mm]esh|MESH)")


def mesh_words(path: Path, strings: bool) -> list[str]:
    """The names (and, with ``strings``, the string constants other than
    docstrings) in ``path`` that speak of the mesh."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        words: list[str] = []
        if isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            words = [node.name]
        elif isinstance(node, ast.alias):
            words = [node.name, node.asname or ""]
        elif strings and isinstance(node, ast.Constant) and id(node) not in docstrings \
                and isinstance(node.value, str | bytes):
            value = node.value
            words = [value.decode("latin-1") if isinstance(value, bytes) else value]
        found += [w for w in words if MESH_WORD.search(w)]
    return found


SEAM_AND_ABOVE = sorted([*(PACKAGE / "http").glob("*.py"), *(PACKAGE / "core").glob("*.py")])


@pytest.mark.parametrize("path", SEAM_AND_ABOVE, ids=lambda p: module_name(p))
def test_the_core_and_the_http_front_know_no_mesh(path: Path) -> None:
    """No ``/peer/`` route, no ``Peer*`` value: an engine's endpoints come
    through the seam's one ``Mount``."""
    assert mesh_words(path, strings=True) == []


def test_the_seam_names_no_mesh_value() -> None:
    assert mesh_words(PACKAGE / "backplane" / "__init__.py", strings=False) == []


def test_the_mesh_word_rule_catches_a_peer_route_and_value(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('"""doc: peers are fine here."""\nfrom x import PeerRequest\n'
                      'ROUTE = b"/peer/x"\nclass TypeErrorish: pass\n')
    assert mesh_words(source, strings=True) == ["PeerRequest", "/peer/x"]
    assert mesh_words(source, strings=False) == ["PeerRequest"]


# A header's name, whole (b"Stream-Next-Offset", "Content-Type"): http/ writes
# each once and renders what the core returns; a sentence naming one is prose.
HEADER_NAME = re.compile(r"(?:stream|producer|access-control)-[a-z-]+|content-type|etag|location"
                         r"|cache-control|allow|retry-after|if-none-match", re.IGNORECASE)


def header_names(path: Path) -> list[str]:
    """The string and bytes constants of ``path`` (docstrings aside) that are
    an HTTP header's name."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            value = node.value
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            if HEADER_NAME.fullmatch(text):
                found.append(text)
    return found


@pytest.mark.parametrize("path", sorted((PACKAGE / "core").glob("*.py")),
                         ids=lambda p: module_name(p))
def test_the_core_writes_no_http_header_name(path: Path) -> None:
    """The core returns values (a tail, a producer's expected sequence); the
    HTTP layer names the headers they go out in."""
    assert header_names(path) == []


def test_the_header_rule_catches_a_header_name_not_a_sentence(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text('"""Stream-Closed in a docstring is prose."""\n'
                      'A = (b"Stream-Closed", b"true")\nB = "Content-Type"\n'
                      'C = "give Stream-TTL or Stream-Expires-At, not both"\nD = b"producer-seq"\n')
    assert sorted(header_names(source)) == ["Content-Type", "Stream-Closed", "producer-seq"]


# What the core's Durable Streams hold (a Stream's fields, the service's own):
# outside pushup/core/ they are read, and changed only through named methods.
STREAM_FIELDS = frozenset({
    "content_type", "ttl", "expires_at", "deadline", "closed", "closed_by", "source",
    "forked_at", "fork_request", "entries", "begins", "tail", "forks", "deleted",
    "producers", "writer_seq", "charged", "waiters", "held", "journal"})
# the lists of them a caller could grow or empty in place
STREAM_LISTS = frozenset({"entries", "begins", "waiters"})


def stream_field_writes(path: Path) -> list[str]:
    """Where ``path`` writes one of ``STREAM_FIELDS`` of an object not its
    own (``x.tail = ...``, ``del x.entries[:]``, ``x.waiters.append(...)``,
    ``setattr(x, name, ...)``): ``self``'s fields are its class's."""
    tree = ast.parse(path.read_text(), str(path))
    found = []

    def foreign(node: ast.expr) -> str | None:
        while isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Attribute) and node.attr in STREAM_FIELDS and not (
                isinstance(node.value, ast.Name) and node.value.id == "self"):
            return f"{ast.unparse(node)} (line {node.lineno})"
        return None

    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets
                       for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("append", "extend", "remove", "clear", "pop", "insert") \
                    and isinstance(node.func.value, ast.Attribute) \
                    and node.func.value.attr in STREAM_LISTS:
                targets = [node.func.value]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "setattr":
            found.append(f"setattr (line {node.lineno})")
        found += [w for w in map(foreign, targets) if w is not None]
    return found


STREAM_USERS = sorted(  # every module outside the core that holds the core's streams
    p for p in PACKAGE.rglob("*.py") if not module_name(p).startswith("pushup.core")
    and {"pushup.core.stream", "pushup.core.streams"} & set(imports(p)))


@pytest.mark.parametrize("path", STREAM_USERS, ids=lambda p: module_name(p))
def test_outside_the_core_a_durable_streams_state_is_changed_only_by_named_methods(
        path: Path) -> None:
    """The core's ``Streams`` owns the streams and their waiters, as ``Service``
    owns ``Store`` and ``Hub``: the HTTP layer and the engines call its (and
    ``Stream``'s) named methods, never write their fields."""
    assert stream_field_writes(path) == []


def test_the_stream_field_rule_catches_writes_not_reads_or_its_own(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f(s, fresh):\n    s.deleted = True\n    del s.entries[:]\n"
                      "    s.waiters.append(f)\n    setattr(s, 'tail', fresh.tail)\n"
                      "    x = s.tail\n    s.wait(f)\n"
                      "class C:\n    def g(self):\n        self.held = 0\n")
    assert stream_field_writes(source) == [
        "s.deleted (line 2)", "s.entries (line 3)", "s.waiters (line 4)", "setattr (line 5)"]
