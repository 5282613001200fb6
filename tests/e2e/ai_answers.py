"""The resumable AI answers example (examples/ai_answers) as a user runs it:
its backend (``node server.mjs``) on a free port, its page in headless
Chromium, reloaded at random points of an answer. Helpers for
tests/e2e/test_ai_answers.py (one node) and tests/cluster/test_ai_answers.py
(3 nodes on Redis, one SIGKILLed)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ai_answers"
TOKENS = 2000
TOKEN_MS = 4  # ~250 tokens/s: the answer takes ~10 s, the test stays well under 40 s


def built() -> None:
    """The example's packages (`make npm-clients` installs them) and its page
    bundled afresh, as its README says (`npm run build`)."""
    npm = shutil.which("npm")
    assert npm, "npm is not installed: `make setup` installs nodejs"
    assert (EXAMPLE / "node_modules" / "@durable-streams" / "client").exists(), \
        "the example is not installed: `make npm-clients` installs it"
    subprocess.run([npm, "run", "--silent", "build"], cwd=EXAMPLE, check=True,
                   capture_output=True, timeout=60)


@contextmanager
def backend(pushup_url: str, port: int) -> Iterator[str]:
    """``node server.mjs`` on ``port`` against ``pushup_url``: its URL (the
    page's origin, which the nodes' --cors-origin must name)."""
    proc = subprocess.Popen(
        [shutil.which("node") or "node", "server.mjs"], cwd=EXAMPLE,
        env={**os.environ, "PUSHUP_URL": pushup_url, "PORT": str(port),
             "TOKENS": str(TOKENS), "TOKEN_MS": str(TOKEN_MS)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert b"ai answers on" in line, line
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(10)


def kept(driver: Any) -> dict[str, Any]:
    """What the page keeps of its answer in sessionStorage ({} before it has one)."""
    raw = driver.execute_script(
        "const id = new URLSearchParams(location.search).get('answer');"
        "return id && sessionStorage.getItem('answer:' + id)")
    return json.loads(raw) if raw else {}


def wait_for(driver: Any, done: Callable[[dict[str, Any]], bool], what: str,
             timeout: float = 30.0) -> dict[str, Any]:
    """The page's kept answer once ``done`` holds of it."""
    deadline = time.monotonic() + timeout
    while True:
        state = kept(driver)
        if state and done(state):
            return state
        assert time.monotonic() < deadline, f"{what}: the page kept {str(state)[:300]}"
        time.sleep(0.02)  # the page's progress is polled: it signals nothing else


def reload_at_random_points(driver: Any, origin: str, reloads: int, seed: int,
                            mid_answer: Callable[[int], None] = lambda seen: None,
                            ) -> dict[str, Any]:
    """Open the page, reload it ``reloads`` times at random points of its answer
    (after a random count of tokens, some at once after the last reload),
    calling ``mid_answer`` once halfway; the answer as the page kept it, whole."""
    rng = random.Random(seed)
    points = sorted(rng.sample(range(1, TOKENS - 100), reloads))
    driver.get(origin + "/")
    for n, point in enumerate(points):
        wait_for(driver, lambda s, p=point: len(s["seen"]) >= p, f"token {point}")
        if n == reloads // 2:
            mid_answer(point)
        driver.refresh()
    return wait_for(driver, lambda s: s["done"], "the answer's end")


def expected_text() -> str:
    words = "Your question is answered here one token at a time".split(" ")
    return "".join(f"{words[i % len(words)]} " for i in range(TOKENS))


def assert_every_token_once_in_order(state: dict[str, Any], driver: Any) -> None:
    assert state["seen"] == list(range(TOKENS))
    assert state["text"] == expected_text()
    shown = driver.execute_script("return document.getElementById('answer').textContent")
    assert shown == expected_text()
