"""The README's examples, pasted against a real node, do what they say: the curl
walkthrough in bash, the Python example with the checkout's client and with the
client distribution (clients/python) installed alone in a fresh environment."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.e2e.support import ROOT, clean_env

README = ROOT / "README.md"
HOST = "localhost:8080"  # where the walkthrough expects `make run`'s node
ID = re.compile(r"[A-Za-z0-9_-]+\.[0-9a-z]+-1")  # the walkthrough's first message


def fenced(text: str) -> list[tuple[str, str]]:
    """Each fenced block of ``text`` in order: (its language, or "" for a bare
    fence, and its body)."""
    blocks, language, body = [], None, []
    for line in text.splitlines(keepends=True):
        if language is None and line.startswith("```"):
            language, body = line[3:].strip(), []
        elif language is not None and line.rstrip() == "```":
            blocks.append((language, "".join(body)))
            language = None
        elif language is not None:
            body.append(line)
    return blocks


def block(heading: str, language: str, nth: int = 0) -> str:
    """The ``nth`` fenced block in ``language`` ("" for a bare fence) after the
    README heading ``heading``."""
    text = README.read_text()
    section = text[text.index(heading):]
    blocks = [body for lang, body in fenced(section) if lang == language]
    assert len(blocks) > nth, f"no ```{language} block {nth} under {heading!r}"
    return blocks[nth]


def walkthrough() -> str:
    """The first ```sh block after the '## Thirty seconds with curl' heading."""
    return block("## Thirty seconds with curl", "sh")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_readme_curl_walkthrough_runs_as_pasted(start_node):
    node = start_node()
    block = walkthrough()
    assert HOST in block
    script = block.replace(HOST, f"127.0.0.1:{node.port}")
    stray = re.search(r"(?<![-\w])8080", script)  # (the ids shown end their node id in -8080)
    assert not stray and "localhost" not in script, "a URL the test did not redirect"
    # As pasted, but stopping at the first failing command (also inside a pipe).
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                       text=True, timeout=60, env=clean_env(), cwd=str(ROOT))
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert r.stderr == "", r.stderr

    lines = r.stdout.splitlines()
    cursors = [line for line in lines if not line.startswith("{")]
    assert len(cursors) == 1 and cursors[0].startswith("c1."), lines  # echo "$CURSOR"
    out = [json.loads(line) for line in lines if line.startswith("{")]
    assert not [o for o in out if "error" in o], out
    # in order: the publish's receipt, the subscribe to both, the held poll, the pull
    assert len(out) == 4, out
    receipt, both, held, pull = out
    assert set(receipt) == {"id", "timestamp", "channels"}, receipt
    # the ids the README shows have the shape the node gives: <node id>.<epoch>-<seq>,
    # the default node id being HOSTNAME-PORT (8080 in the walkthrough)
    shown = re.search(r'^# \{"id":"([^"]+)"', block, re.M)
    assert shown, "no receipt shown in the walkthrough"
    assert ID.fullmatch(shown.group(1)) and ID.fullmatch(receipt["id"]), (shown, receipt)
    assert shown.group(1).split(".")[0].endswith("-8080")
    assert receipt["channels"] == ["author:John", "tag:c++"]

    def data(answer):
        return [(m["id"], m["data"]) for m in answer["messages"]]

    templates = (receipt["id"], {"title": "Templates"})
    assert data(both) == [templates]
    assert both["messages"][0]["channels"] == ["author:John", "tag:c++"]
    # the pull sees both messages; the held poll, given the cursor after "Templates",
    # returned the new message and nothing else
    assert [d for _, d in data(pull)] == [{"title": "Templates"}, "new!"], pull
    new = data(pull)[1]
    assert new[0] != receipt["id"]
    assert data(held) == [new] and held["messages"][0]["channels"] == ["tag:c++"], held
    assert held["cursor"] != cursors[0] and not held.get("gap", False)


PYTHON_HEADING = "## From Python: `pushup.client`"


def python_example(port: int) -> str:
    """The README's Python example, its node's URL redirected to ``port``."""
    source = block(PYTHON_HEADING, "python")
    assert f"http://{HOST}" in source
    script = source.replace(HOST, f"127.0.0.1:{port}")
    assert "8080" not in script and "localhost" not in script, "a URL the test did not redirect"
    return script


def assert_prints_what_the_readme_shows(out: str) -> None:
    """The output the README shows under the example: the receipt (an id and True,
    a 201 from a single node), then hi and bye."""
    shown = block(PYTHON_HEADING, "").splitlines()  # the bare ``` block after it
    lines = out.splitlines()
    assert len(lines) == len(shown) == 3, (shown, lines)
    receipt_id, acknowledged = lines[0].split(" ")
    assert ID.fullmatch(receipt_id) and acknowledged == "True", lines
    assert ID.fullmatch(shown[0].split(" ")[0]) and shown[0].endswith(" True"), shown
    assert lines[1:] == shown[1:] == ["hi", "bye"], (shown, lines)


def test_readme_python_example_runs_as_pasted(start_node, tmp_path):
    node = start_node()
    script = tmp_path / "example.py"
    script.write_text(python_example(node.port))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=60, env=clean_env(), cwd=str(tmp_path))
    assert r.returncode == 0 and r.stderr == "", (r.returncode, r.stdout, r.stderr)
    assert_prints_what_the_readme_shows(r.stdout)


SERVER_ONLY = {"twisted", "treq", "pushup", "httptools", "msgspec", "hiredis",
               "prometheus-client", "mypy"}


def test_the_client_installs_alone_and_runs_the_readme_example(start_node, tmp_path):
    """pushup-client, built from clients/python as the README says, installs into a
    fresh environment with nothing of the server (no Twisted, no core), and the
    README's example runs there with `pushup` a namespace holding only the client."""
    # A copy, so nothing but clients/python itself can be packaged.
    source = shutil.copytree(ROOT / "clients" / "python", tmp_path / "client")
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # The client's wheel and its dependencies' (from pip's cache or the index)...
    built = subprocess.run([*pip, "wheel", str(source), "-w", str(wheels)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    # ...then a fresh environment given only those, offline.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    installed = subprocess.run(
        [python, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-index",
         "--find-links", str(wheels), "pushup-client"], capture_output=True, text=True,
        timeout=300)
    assert installed.returncode == 0, installed.stderr
    listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, timeout=60, check=True)
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"pushup-client", "httpx", "pyjwt"} <= names and not names & SERVER_ONLY, names

    node = start_node()
    script = tmp_path / "example.py"
    script.write_text(python_example(node.port) + (
        "\nimport sys, pushup\n"
        "assert pushup.__file__ is None, pushup.__file__  # a namespace: the client only\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('twisted', 'treq')]\n"))
    r = subprocess.run([python, "-I", str(script)], capture_output=True, text=True, timeout=60,
                       env=clean_env(), cwd=str(tmp_path))
    assert r.returncode == 0 and r.stderr == "", (r.returncode, r.stdout, r.stderr)
    assert_prints_what_the_readme_shows(r.stdout)


OUTSIDE = re.compile(r"\.\./shared|/work/(?:shared|main)\b")  # where this repository was made


def test_nothing_in_the_repository_points_outside_it():
    skip = {".git", ".venv", "node_modules", "out", "__pycache__"}
    hits = []
    for path in ROOT.rglob("*"):
        if skip & set(path.relative_to(ROOT).parts) or not path.is_file():
            continue
        if path.suffix in {".py", ".md", ".toml", ".html", ".js", ".cfg", ".template", ".conf",
                           ".service", ".example", ".txt", ".json"} or path.name == "Makefile":
            text = path.read_text(errors="replace")
            hits += [f"{path.relative_to(ROOT)}: {m.group()}" for m in OUTSIDE.finditer(text)]
    assert hits == []


DOCS = ["README.md", "docs/*.md", "clients/*/README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def outside_fences(text: str) -> str:
    return "".join(re.split(r"^```.*?^```$", text, flags=re.S | re.M))


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``path`` (lower case, punctuation
    dropped, spaces made hyphens, a repeat suffixed -1, -2 ...)."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.*)$", outside_fences(path.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def test_every_link_between_the_docs_resolves():
    """The README and docs/ link each other's sections (moved from the README):
    each relative link names a file of the repository and, with #, a heading of it."""
    broken = []
    for doc in sorted({p for pattern in DOCS for p in ROOT.glob(pattern)}):
        for target in LINK.findall(outside_fences(doc.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            name, _, anchor = target.partition("#")
            path = (doc.parent / name).resolve() if name else doc
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []
