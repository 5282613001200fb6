"""examples/ai_answers on one node: a page following an answer's Durable Stream
over SSE with @durable-streams/client, reloaded 20 times at random points of a
2,000-token answer, shows every token once, in order (issue 39, part 3).

Real processes: ``pushup serve``, the example's Node backend, headless Chromium."""

from __future__ import annotations

import pytest

from deploy.processes import free_port
from tests.chromium import chrome
from tests.e2e.ai_answers import (
    assert_every_token_once_in_order,
    backend,
    built,
    reload_at_random_points,
)
from tests.toolkit import ServedNode


@pytest.mark.timeout(120)
def test_a_page_reloaded_20_times_mid_answer_shows_every_token_once_in_order():
    built()
    port = free_port()
    node = ServedNode("--host", "127.0.0.1", "--cors-origin", f"http://127.0.0.1:{port}")
    try:
        with backend(node.url, port) as origin:
            driver = chrome()
            try:
                state = reload_at_random_points(driver, origin, reloads=20, seed=39)
                assert_every_token_once_in_order(state, driver)
            finally:
                driver.quit()
    finally:
        assert node.stop() == 0


def test_the_readme_section_runs_the_example_as_this_test_does():
    """The README's commands are the ones the tests run: the page's origin in
    the node's --cors-origin, the bundle built, the backend started, on the
    ports the backend takes by default (make run's node on 8080)."""
    from tests.e2e.ai_answers import EXAMPLE
    from tests.e2e.test_readme import block

    commands = block("### Resumable AI answers", "sh")
    assert "PUSHUP_CORS_ORIGIN=http://127.0.0.1:3000 make run &" in commands
    assert "cd examples/ai_answers && npm install && npm run build" in commands
    assert "npm start" in commands
    server = (EXAMPLE / "server.mjs").read_text()
    assert '"http://127.0.0.1:8080"' in server and "process.env.PORT ?? 3000" in server
