"""The README's page for the browser ("Ten lines for a web page") in real headless
Chromium: served over http from the origin `--cors-origin` names, it subscribes; opened
as a file (`file://`, the origin `null`), the browser refuses it the node, as the README
says, so it must be served over http."""

from __future__ import annotations

import http.server
import threading

from tests.chromium import chrome
from tests.e2e.test_readme import block

# Beside the README's page: what the browser let it fetch from the node.
PROBE = """<script>fetch('%(node)s/health').then(() => { document.title = 'allowed'; },
  () => { document.title = 'refused'; });</script>"""


def test_the_readmes_page_works_over_http_and_is_refused_as_a_file(tmp_path, start_node):
    from selenium.webdriver.support.ui import WebDriverWait

    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(tmp_path), **k)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    page_origin = f"http://127.0.0.1:{server.server_address[1]}"
    node = start_node("--cors-origin", page_origin)
    page = block("## Ten lines for a web page", "html").replace("http://localhost:8080",
                                                                node.url)
    assert node.url in page
    (tmp_path / "page.html").write_text(page + PROBE % {"node": node.url})
    driver = chrome()
    try:
        wait = WebDriverWait(driver, 30)
        driver.get(f"file://{tmp_path}/page.html")
        wait.until(lambda d: d.title in ("allowed", "refused"))
        assert driver.title == "refused"
        assert node.stats()["waiting"] == 0  # its subscribe never reached the node
        driver.get(f"{page_origin}/page.html")
        wait.until(lambda d: d.title in ("allowed", "refused"))
        assert driver.title == "allowed"
        wait.until(lambda d: node.stats()["waiting"] >= 1)  # the page's subscriber holds
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()
