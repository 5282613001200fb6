"""The README's Durable Streams example, with the protocol's own client (npm
``@durable-streams/client``, installed with the conformance suite and pinned by
its lock file), pasted against a real node: it writes a JSON stream with an
idempotent producer, then reads it back over SSE and prints the item."""

from __future__ import annotations

import queue
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

from tests.e2e.test_readme import README, block
from tests.toolkit import ServedNode, wait_healthy

CLIENTS = Path(__file__).resolve().parent / "streams" / "node_modules"
README_URL = "http://127.0.0.1:8080"  # where the example expects `make run`'s node


def test_the_readme_durable_streams_example_writes_and_reads_a_stream(tmp_path: Path) -> None:
    node_js = shutil.which("node")
    assert node_js is not None, "node is not installed: `make setup` installs nodejs"
    assert (CLIENTS / "@durable-streams" / "client").exists(), "`make npm-clients` installs it"
    heading = "### Durable Streams with the protocol's own client"
    example = block(heading, "js")
    assert README_URL in example
    # the file name the README says to save it as: an ES module's
    section = README.read_text().partition(heading)[2].partition("```js")[0]
    named = re.search(r"save this as `([^`]+)`", section)
    assert named is not None and named.group(1).endswith(".mjs"), section
    node = ServedNode("--host", "127.0.0.1")
    try:
        wait_healthy(node.url, time.monotonic() + 30, node.proc)
        (tmp_path / "node_modules").symlink_to(CLIENTS)  # as if installed beside it
        script = tmp_path / named.group(1)
        script.write_text(example.replace(README_URL, node.url))
        reader = subprocess.Popen([node_js, str(script)], cwd=tmp_path, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL)
        lines: queue.Queue[str] = queue.Queue()
        assert reader.stdout is not None and reader.stderr is not None
        out = reader.stdout
        threading.Thread(target=lambda: [lines.put(line) for line in out], daemon=True).start()
        try:
            first = lines.get(timeout=30)  # it follows the stream: it prints, then waits
        finally:
            reader.kill()
            reader.wait()
        assert first.startswith("[ { text: 'hello' } ] "), (first, reader.stderr.read())
        # the offset after it: one append, 17 bytes ('{"text":"hello"}' and a comma)
        assert first.split()[-1] == "0000000000000001_0000000000000017", first
    finally:
        node.stop()
