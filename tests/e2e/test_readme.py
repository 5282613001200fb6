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
    assert "8080" not in script and "localhost" not in script, "a URL the test did not redirect"
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
    receipts = [o for o in out if "id" in o]
    answers = [o for o in out if "messages" in o]
    assert len(receipts) == 2 and len(answers) == 3, out
    first, new = sorted(receipts, key=lambda o: o["timestamp"])
    assert first["channels"] == ["author:John", "tag:c++"] and new["channels"] == ["tag:c++"]

    def data(answer):
        return [(m["id"], m["data"]) for m in answer["messages"]]

    templates = (first["id"], {"title": "Templates"})
    # the subscribe to both channels, the held poll, the pull (in output order, except
    # that the held poll and the publish that answers it may print either way round)
    both, held, pull = answers
    assert data(both) == [templates]
    assert both["messages"][0]["channels"] == ["author:John", "tag:c++"]
    # the held poll, given the cursor after "Templates", returned the new message only
    assert data(held) == [(new["id"], "new!")], held
    assert held["cursor"] != cursors[0] and not held.get("gap", False)
    assert data(pull) == [templates, (new["id"], "new!")], pull
