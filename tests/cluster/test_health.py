"""``/health`` says whether a node can take a publish, so a balancer routes right.

A real node on a real ``redis-server``: while Redis is paused (SIGSTOP) or
gone (SIGKILL), every publish would get 503/504, so ``/health`` is 503
``engine_unavailable``; once Redis answers again it is 200.
"""
from __future__ import annotations

from tests.cluster.clients import jrequest, wait_until


def health(base: str) -> tuple[int, str]:
    status, body = jrequest("GET", base + "/health", timeout=10)
    return status, body["status"] if status == 200 else body["error"]["code"]


def test_health_is_503_while_redis_is_paused_or_gone_and_200_once_it_answers(
        fresh_cluster, redis_server):
    c = fresh_cluster(1, haproxy=False, engine=redis_server.url)
    base = c.bases[0]
    assert health(base) == (200, "ok")
    redis_server.pause()  # SIGSTOP: the connections stay open, nothing answers
    try:
        assert health(base) == (503, "engine_unavailable")
    finally:
        redis_server.resume()
    wait_until(lambda: health(base) == (200, "ok"), 20, 0.1, "healthy once Redis answers")
    redis_server.kill()  # SIGKILL: the connections drop
    wait_until(lambda: health(base) == (503, "engine_unavailable"), 10, 0.05,
               "503 once Redis is gone")
    redis_server.restart()
    wait_until(lambda: health(base) == (200, "ok"), 20, 0.1, "healthy once Redis is back")
