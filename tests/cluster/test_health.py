"""``/health`` says whether a node can take a publish, so a balancer routes right.

A real node on a real ``redis-server``: while Redis is paused (SIGSTOP) or
gone (SIGKILL), every publish would get 503/504, so ``/health`` is 503
``engine_unavailable``; once Redis answers again it is 200. On a Redis Cluster
whose one primary is stopped, every node stays 200 (it can serve the other
primaries' channels), says which primary is down, and only that primary's
channels are refused.
"""
from __future__ import annotations

import os
import signal

from deploy.redis_cluster import RedisCluster
from pushup.backplane.redis.partitions import keys_of
from tests.cluster.clients import jrequest, publish, uniq, wait_until
from tests.cluster.redis_backends import Cluster


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


def primaries_of(base: str) -> dict[str, str]:
    """What a node's /health says of each Redis primary: address -> state."""
    status, body = jrequest("GET", base + "/health", timeout=10)
    assert status == 200, (base, status, body)
    return {p["address"]: p["state"] for p in body["redis"]["primaries"]}


def failed_in_cluster(cluster: RedisCluster, port: int, by: int) -> bool:
    """The primary on ``by`` has marked the one on ``port`` failed (a primary
    uncovered: with Redis's default every node would answer CLUSTERDOWN now)."""
    for line in cluster.cli(by, "CLUSTER", "NODES").decode().splitlines():
        fields = line.split()
        if fields[1].startswith(f"127.0.0.1:{port}@"):
            return "fail" in fields[2].split(",")
    raise AssertionError(f"{port} not in the cluster's view")


def test_one_stopped_primary_costs_its_channels_only_and_every_node_stays_healthy(
        fresh_cluster):
    redis = RedisCluster(primaries=3, replicas=0)  # no replica: nothing takes its slots
    redis.start()
    try:
        where = Cluster(redis)
        victim, *live = redis.primaries()
        by_owner: dict[int, list[str]] = {port: [] for port in redis.primaries()}
        for _ in range(200):  # bounded: a channel's partition is on a primary by hash
            if all(len(names) >= 2 for names in by_owner.values()):
                break
            name = uniq("health")
            by_owner[where.owner(keys_of(name).log)].append(name)
        on_victim = by_owner[victim][:2]
        on_live = [name for port in live for name in by_owner[port][:2]]
        c = fresh_cluster(3, haproxy=True, engine=redis.seeds)
        for name in on_victim + on_live:
            publish(c.front_url, [name], "before")
        victim_address = f"127.0.0.1:{victim}"

        os.kill(redis.nodes[victim].pid, signal.SIGSTOP)
        try:
            # each node finds the primary down (its PING unanswered), and stays healthy
            for base in c.bases:
                wait_until(lambda base=base: primaries_of(base)[victim_address] == "down",
                           20, 0.1, f"{base} to see {victim_address} down")
            wait_until(lambda: failed_in_cluster(redis, victim, by=live[0]), 20, 0.1,
                       "Redis Cluster to mark the stopped primary failed")
            for base in c.bases:
                states = primaries_of(base)  # 200, or primaries_of fails
                assert states == {victim_address: "down",
                                  **{f"127.0.0.1:{port}": "up" for port in live}}, states
            # through the front: the live primaries' channels are served...
            for name in on_live:
                status, body = jrequest("POST", c.front_url + "/publish",
                                        {"channels": [name], "data": "during"})
                assert status == 201, (name, status, body)
            # ... the stopped primary's are refused, nothing sent
            for name in on_victim:
                status, body = jrequest("POST", c.front_url + "/publish",
                                        {"channels": [name], "data": "during"})
                assert (status, body["error"]["code"]) == (503, "engine_unavailable"), body
        finally:
            os.kill(redis.nodes[victim].pid, signal.SIGCONT)
        for base in c.bases:
            wait_until(lambda base=base: set(primaries_of(base).values()) == {"up"},
                       20, 0.1, f"{base} to see every primary up")
        for name in on_victim:
            publish(c.front_url, [name], "after")
    finally:
        redis.stop()
