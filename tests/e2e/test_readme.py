"""The README's curl walkthrough, pasted into bash against a real node, does what it says."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from pushup_e2e import ROOT, clean_env

README = ROOT / "README.md"
HOST = "localhost:8080"  # where the walkthrough expects `make run`'s node
ID = re.compile(r"[A-Za-z0-9_-]+\.[0-9a-z]+-1")  # the walkthrough's first message


def walkthrough() -> str:
    """The first ```sh block after the '## Thirty seconds with curl' heading."""
    text = README.read_text()
    section = text[text.index("## Thirty seconds with curl"):]
    m = re.search(r"^```sh\n(.*?)^```$", section, re.S | re.M)
    assert m, "no ```sh block in the README's curl walkthrough"
    return m.group(1)


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
