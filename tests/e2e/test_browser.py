"""pushup.js in real headless Chromium, from a page of another origin.

The page is served by a plain HTTP server on another port (another origin);
it imports ``/pushup.js`` from a real ``pushup serve`` and subscribes with
each transport. Also the issue-8 case: a page of a foreign origin cannot
publish with a ``no-cors`` POST.
"""

from __future__ import annotations

import http.server
import os
import threading

import pytest

from tests.chromium import chrome

PAGE = """<!doctype html><meta charset="utf-8"><title>pushup.js test</title>
<script type="module">
  import { subscribe } from '%(node)s/pushup.js';
  window.received = { 'long-poll': [], 'sse': [] };
  window.ready = 0;
  for (const transport of ['long-poll', 'sse']) {
    subscribe('%(node)s', ['%(channel)s'], { since: 'now', transport,
      onMessage: (m) => window.received[transport].push(m.data),
      onError: (e) => window.received[transport].push('error: ' + e.message) });
  }
</script>"""

# What any page can do without CORS: a "simple" POST the browser sends unasked.
FORGE = """<!doctype html><meta charset="utf-8"><title>forged publish</title>
<script>
  window.forge = () => fetch('%(node)s/publish', { method: 'POST', mode: 'no-cors',
    headers: { 'Content-Type': 'text/plain' },
    body: JSON.stringify({ channels: ['%(channel)s'], data: 'forged' }) });
</script>"""


@pytest.fixture
def page_server(tmp_path):
    """Serves tmp_path on a free port: the page's origin, not the node's."""
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(tmp_path), **k)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, tmp_path
    server.shutdown()
    server.server_close()


def test_a_page_of_another_origin_gets_each_message_once_in_order(page_server, start_node):
    from selenium.webdriver.support.ui import WebDriverWait

    server, root = page_server
    page_origin = f"http://127.0.0.1:{server.server_address[1]}"
    node = start_node("--cors-origin", page_origin)
    driver = chrome()
    try:
        channel = "browser-" + os.urandom(4).hex()
        (root / "index.html").write_text(PAGE % {"node": node.url, "channel": channel})
        driver.get(f"{page_origin}/index.html")
        wait = WebDriverWait(driver, 30)
        wait.until(lambda d: node.stats()["waiting"] >= 2)  # both transports hold
        for i in range(1, 4):
            node.publish([channel], i)
        got = wait.until(lambda d: (lambda r: r if len(r["long-poll"]) >= 3
                                    and len(r["sse"]) >= 3 else None)(
            d.execute_script("return window.received")))
        assert got == {"long-poll": [1, 2, 3], "sse": [1, 2, 3]}
    finally:
        driver.quit()


def test_pages_of_each_of_several_cors_origins_are_served(page_server, start_node):
    """The issue-20 case: a page opened as http://127.0.0.1:PORT and the same page
    opened as http://localhost:PORT are two origins; both are given and both work
    (the module import, the poll and the event stream are CORS requests)."""
    from selenium.webdriver.support.ui import WebDriverWait

    server, root = page_server
    port = server.server_address[1]
    origins = [f"http://127.0.0.1:{port}", f"http://localhost:{port}"]
    node = start_node("--cors-origin", ",".join(origins))
    driver = chrome()
    try:
        for origin in origins:
            channel = "origins-" + os.urandom(4).hex()
            (root / f"{channel}.html").write_text(PAGE % {"node": node.url, "channel": channel})
            driver.get(f"{origin}/{channel}.html")
            node.wait_subscribers(channel, 2, timeout=30)  # both transports hold
            node.publish([channel], origin)
            got = WebDriverWait(driver, 30).until(lambda d: (lambda r: r if len(r["long-poll"])
                                                             and len(r["sse"]) else None)(
                d.execute_script("return window.received")))
            assert got == {"long-poll": [origin], "sse": [origin]}, origin
    finally:
        driver.quit()


def test_a_page_of_a_foreign_origin_cannot_publish_without_the_token(page_server, start_node):
    server, root = page_server
    page_origin = f"http://127.0.0.1:{server.server_address[1]}"
    node = start_node()  # no --cors-origin, no token: the loopback default
    driver = chrome()
    try:
        channel = "forged-" + os.urandom(4).hex()
        (root / "index.html").write_text(FORGE % {"node": node.url, "channel": channel})
        driver.get(f"{page_origin}/index.html")
        published = node.stats()["published"]
        # resolves once the node has answered (an opaque response: the page can't read it)
        driver.execute_async_script(
            "const done = arguments[0]; window.forge().then(() => done(), () => done());")
        assert node.stats()["published"] == published
        assert node.subscribe([channel], since="0")["messages"] == []
    finally:
        driver.quit()


PRESENCE_PAGE = """<!doctype html><meta charset="utf-8"><title>pushup.js presence</title>
<script type="module">
  import { subscribe } from '%(node)s/pushup.js';
  window.seen = { 'long-poll': [], 'sse': [] };
  const tokens = { 'long-poll': '%(ann)s', 'sse': '%(bob)s' };
  for (const transport of ['long-poll', 'sse']) {
    const sub = subscribe('%(node)s', ['%(channel)s'], { since: 'now', transport,
      token: tokens[transport], presence: true,
      onPresence: () => {
        window.seen[transport] = [...sub.members.get('%(channel)s').keys()].sort();
      } });
  }
</script>"""


def test_presence_in_the_browser_over_a_long_poll_and_an_event_stream(page_server, start_node):
    """Each transport with ``presence: true`` shows both users (one per
    transport): the long poll's ``presence`` list, the stream's ``event: presence``."""
    import time

    import jwt
    from selenium.webdriver.support.ui import WebDriverWait

    server, root = page_server
    page_origin = f"http://127.0.0.1:{server.server_address[1]}"
    secret = "a-browser-test-subscribe-secret-32-bytes"
    node = start_node("--cors-origin", page_origin, "--presence", "--subscribe-secret", secret)
    driver = chrome()
    try:
        channel = "presence-" + os.urandom(4).hex()
        tokens = {user: jwt.encode({"channels": [channel], "sub": user,
                                    "exp": int(time.time()) + 600}, secret, algorithm="HS256")
                  for user in ("ann", "bob")}
        (root / "presence.html").write_text(PRESENCE_PAGE % {
            "node": node.url, "channel": channel, **tokens})
        driver.get(f"{page_origin}/presence.html")
        both = {"long-poll": ["ann", "bob"], "sse": ["ann", "bob"]}
        got = WebDriverWait(driver, 30).until(lambda d: (lambda s: s if s == both else None)(
            d.execute_script("return window.seen")))
        assert got == both
    finally:
        driver.quit()
