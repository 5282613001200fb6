"""examples/ai_answers through 3 nodes on one redis-server behind HAProxy, as
`make cluster ENGINE=redis` runs them: the page, reloaded 20 times at random
points of a 2,000-token answer, and the node that serves its stream SIGKILLed
halfway, shows every token once, in order (issue 39, part 3). The page's client
reconnects through HAProxy to a node alive, from the offset it had; the
backend's producer repeats what the dead node never answered (a duplicate then,
never a second copy).

Real processes: redis-server, 3 ``pushup serve``, HAProxy, the example's Node
backend, headless Chromium."""

from __future__ import annotations

import signal

import pytest

from deploy.launch import LocalCluster, get_json
from deploy.processes import free_port
from tests.chromium import chrome
from tests.e2e.ai_answers import (
    assert_every_token_once_in_order,
    backend,
    built,
    reload_at_random_points,
    wait_for,
)
from tests.toolkit import wait_until


def serving_the_page(c: LocalCluster) -> int:
    """The node that serves the page's SSE response now (once the response
    of the page before its last reload has ended on its node)."""
    def readers() -> list[int]:
        return [get_json(c.node_url(i) + "/stats")[1]["stream_sse_readers"]
                for i in range(len(c.node_ports))]

    wait_until(lambda: sum(readers()) == 1, 10, 0.05, "one SSE response, the page's")
    return readers().index(1)


@pytest.mark.timeout(180)
def test_a_page_through_a_cluster_whose_node_serving_it_dies_shows_every_token_once(
        redis_server):
    built()
    port = free_port()
    c = LocalCluster(nodes=3, haproxy=True, engine=redis_server.url,
                     node_env={"PUSHUP_CORS_ORIGIN": f"http://127.0.0.1:{port}"})
    try:
        c.start()
        with backend(c.front_url, port) as origin:
            driver = chrome()
            try:
                def kill_the_node_serving_the_page(seen: int) -> None:
                    c.kill(serving_the_page(c), signal.SIGKILL)
                    # the page goes on by itself, through another node
                    wait_for(driver, lambda s: len(s["seen"]) >= seen + 100,
                             "tokens after the kill")

                state = reload_at_random_points(driver, origin, reloads=20, seed=7,
                                                mid_answer=kill_the_node_serving_the_page)
                assert_every_token_once_in_order(state, driver)
            finally:
                driver.quit()
    finally:
        c.stop()
