"""The Redis a test's nodes run on, one plain ``redis-server`` or a real Redis Cluster,
behind one face: the tests of the engine's contract hold on both.

The rule: a test sees Redis only as a user would -- the ``--engine`` value
(``url``) and a few commands read or done to Redis from outside (``cli`` of a key
on the node that owns it, every node's answer to one command, pause, resume and
restart empty). On a cluster a key's owner is asked of Redis itself (``CLUSTER
KEYSLOT``, then ``CLUSTER SLOTS``), never computed by the code under test.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

from deploy.redis_cluster import RedisCluster
from deploy.redis_server import RedisServer


def running_cluster(replicas: int) -> Iterator[RedisCluster]:
    """A Redis Cluster of 3 primaries with ``replicas`` each, for a fixture to
    yield from: started, and stopped by PID when the fixture ends."""
    cluster = RedisCluster(primaries=3, replicas=replicas)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


class OneServer:
    """One ``redis-server`` of the test's own."""

    kind = "server"

    def __init__(self, server: RedisServer) -> None:
        self.server = server

    @property
    def url(self) -> str:
        return self.server.url

    def cli(self, *args: Any) -> Any:
        """One command; a keyed one's key is ``args[1]`` (on one server: all keys)."""
        return self.server.cli(*args)

    def each(self, *args: Any) -> list[Any]:
        """The command on every node that holds data (here: the one)."""
        return [self.server.cli(*args)]

    def pause(self) -> None:
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()

    def restart_empty(self) -> None:
        """SIGKILL, then start again on the same port holding nothing."""
        self.server.kill()
        self.server.restart()


class Cluster:
    """A real Redis Cluster (deploy/redis_cluster.py), shared by a module's tests:
    ``clean`` empties it between them (nodes of one test never see another's)."""

    kind = "cluster"

    def __init__(self, cluster: RedisCluster) -> None:
        self.cluster = cluster

    @property
    def url(self) -> str:
        return self.cluster.seeds

    def owner(self, key: str | bytes) -> int:
        """The port of the primary owning ``key``'s slot, as Redis says."""
        slot = self.cluster.cli(self.cluster.primaries()[0], "CLUSTER", "KEYSLOT", key)
        return self.cluster.owner_of(int(slot))

    def cli(self, *args: Any) -> Any:
        """One keyed command (its key ``args[1]``), on the primary owning the key."""
        return self.cluster.cli(self.owner(args[1]), *args)

    def each(self, *args: Any) -> list[Any]:
        """The command on every primary."""
        return [self.cluster.cli(port, *args) for port in self.cluster.primaries()]

    def _running(self) -> list[int]:
        return [port for port, node in self.cluster.nodes.items()
                if node._process is not None and not node.exited()]

    def pause(self) -> None:
        """SIGSTOP every node: connections stay open, nothing is answered."""
        for port in self._running():
            os.kill(self.cluster.nodes[port].pid, signal.SIGSTOP)

    def resume(self) -> None:
        for port in self._running():
            os.kill(self.cluster.nodes[port].pid, signal.SIGCONT)
        self.cluster.wait_ok()

    def restart_empty(self) -> None:
        """SIGKILL every node, then start each again (nodes.conf kept, no data): the
        same cluster, holding nothing -- Redis lost everything it acknowledged."""
        ports = list(self.cluster.nodes)
        for port in ports:
            self.cluster.kill(port)
        for port in ports:
            self.cluster.restart(port)
        self.cluster.wait_ok()

    def clean(self) -> None:
        """Every node running and resumed, the cluster ok, and no key left."""
        for port, node in self.cluster.nodes.items():
            if node._process is None or node.exited():
                self.cluster.restart(port)
            else:
                os.kill(node.pid, signal.SIGCONT)
        self.cluster.wait_ok()
        for port in self.cluster.primaries():
            self.cluster.cli(port, "FLUSHALL")
