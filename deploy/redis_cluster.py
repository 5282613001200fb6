"""A real Redis Cluster of our own (tests): ``redis-server`` processes in cluster mode on
free loopback ports, joined by ``redis-cli --cluster create``, controlled only by PID.

``RedisCluster`` starts ``primaries`` nodes plus ``replicas`` per primary, each a
``RedisServer`` (deploy/redis_server.py) in its own temporary directory, and waits
until every node says ``cluster_state:ok``. It can kill, restart and wait for a
failover, and move one slot between primaries the way ``redis-cli --cluster reshard``
does. Every wait is bounded.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from typing import Any

import hiredis

from deploy.processes import free_port
from deploy.redis_server import RedisServer, RedisServerError, command

NODE_TIMEOUT_MS = 1000  # --cluster-node-timeout: a dead primary is failed over within ~2 s
READY_TIMEOUT = 30.0  # seconds for a new cluster to agree it is ok
FAILOVER_TIMEOUT = 20.0  # seconds for a replica to take a killed primary's slots
SLOTS = 16384


def _free_cluster_port() -> int:
    """A free loopback port whose cluster bus port (port + 10000) is free and valid too."""
    for _attempt in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RedisServerError("no free port pair (port, port + 10000) for a cluster node")


class ClusterNode(RedisServer):
    """One cluster-mode ``redis-server``; its nodes.conf lives in its own directory, so
    ``restart`` brings it back as the same node (it rejoins, as a replica if it was
    failed over meanwhile)."""

    def __init__(self) -> None:
        super().__init__("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                         "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                         # a replica syncs at once (not after 5 s) and may always take
                         # over, however long it has been cut off from its primary
                         "--repl-diskless-sync-delay", "0",
                         "--cluster-replica-validity-factor", "0",
                         # a primary that fails with no replica to take over costs its
                         # own slots only: by default (yes) every node answers
                         # CLUSTERDOWN for every slot once one is uncovered, so one
                         # primary's trouble would stop every channel (docs/cluster.md)
                         "--cluster-require-full-coverage", "no")

    def start(self) -> None:
        if shutil.which("redis-server") is None:
            raise RedisServerError("redis-server is not installed (make system-packages)")
        for _attempt in range(3):
            self.port = _free_cluster_port()
            if self._spawn():
                return
        raise RedisServerError(f"redis-server did not start; log:\n{self.log_tail()}")


class RedisCluster:
    """``primaries`` primaries with ``replicas`` replicas each; ``start``/``stop``."""

    def __init__(self, primaries: int = 3, replicas: int = 0) -> None:
        if primaries < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 primaries")
        self.primary_count = primaries
        self.replica_count = replicas
        self.nodes: dict[int, ClusterNode] = {}  # by port

    @property
    def ports(self) -> list[int]:
        return list(self.nodes)

    @property
    def seeds(self) -> str:
        """The ``--engine`` value naming every node: redis://127.0.0.1:P1,127.0.0.1:P2,..."""
        return "redis://" + ",".join(f"127.0.0.1:{port}" for port in self.nodes)

    def start(self) -> None:
        if shutil.which("redis-cli") is None:
            raise RedisServerError("redis-cli is not installed (make system-packages)")
        try:
            for _ in range(self.primary_count * (1 + self.replica_count)):
                node = ClusterNode()
                node.start()
                self.nodes[node.port] = node
            created = subprocess.run(
                ["redis-cli", "--cluster", "create",
                 *(f"127.0.0.1:{port}" for port in self.nodes),
                 "--cluster-replicas", str(self.replica_count), "--cluster-yes"],
                capture_output=True, timeout=READY_TIMEOUT, check=False)
            if created.returncode != 0:
                raise RedisServerError("redis-cli --cluster create failed:\n"
                                       + created.stdout.decode(errors="replace")[-2000:])
            self.wait_ok()
        except BaseException:
            self.stop()
            raise

    def cli(self, port: int, *args: Any) -> Any:
        """One command to the node on ``port``, answered synchronously."""
        return command(port, *args)

    def wait_ok(self, timeout: float = READY_TIMEOUT) -> None:
        """Until every running node says ``cluster_state:ok``, agrees on the primaries,
        and (a replica) has finished its sync from its primary."""
        def settled() -> bool:
            views = set()
            for port, node in self.nodes.items():
                if node.exited() or node._process is None:
                    continue
                if b"cluster_state:ok" not in self.cli(port, "CLUSTER", "INFO"):
                    return False
                views.add(tuple(sorted(self.slot_owners(port).items())))
                replication = self.cli(port, "INFO", "replication")
                if b"role:slave" in replication and b"master_link_status:up" not in replication:
                    return False
            return len(views) == 1

        self._until(settled, timeout, "every node to say cluster_state:ok")

    def slot_owners(self, port: int | None = None) -> dict[tuple[int, int], int]:
        """(first slot, last slot) → the port of the primary owning the range, as the node
        on ``port`` (default: any running node) sees it."""
        asked = port if port is not None else self._any_running()
        return {(start, end): int(owner[1]) for start, end, owner, *_replicas
                in self.cli(asked, "CLUSTER", "SLOTS")}

    def owner_of(self, slot: int, port: int | None = None) -> int:
        for (start, end), owner in self.slot_owners(port).items():
            if start <= slot <= end:
                return owner
        raise RedisServerError(f"slot {slot} has no owner")

    def primaries(self) -> list[int]:
        return sorted(set(self.slot_owners().values()))

    def node_id(self, port: int) -> str:
        return str(self.cli(port, "CLUSTER", "MYID").decode())

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (by its PID)."""
        self.nodes[port].kill()

    def restart(self, port: int) -> None:
        """Start the node on ``port`` again, with its nodes.conf (it rejoins)."""
        self.nodes[port].restart()

    def wait_promoted(self, old_primary: int, timeout: float = FAILOVER_TIMEOUT) -> int:
        """Until a replica owns every slot ``old_primary`` owned; return its port."""
        slots = [start for (start, _end), owner in self.slot_owners().items()
                 if owner == old_primary]
        if not slots:
            raise RedisServerError(f"127.0.0.1:{old_primary} owns no slot")

        def promoted() -> int | None:
            owners = {self.owner_of(slot) for slot in slots}
            owner = owners.pop() if len(owners) == 1 else old_primary
            if owner == old_primary:
                return None
            ok = b"cluster_state:ok" in self.cli(owner, "CLUSTER", "INFO")
            return owner if ok else None

        return self._until(promoted, timeout, f"a replica to take over from {old_primary}")

    def migrate_slot(self, slot: int, to_port: int, *, finish: bool = True) -> None:
        """Move ``slot`` and its keys to the primary on ``to_port``, as ``redis-cli
        --cluster reshard`` does: IMPORTING on the target, MIGRATING on the source,
        MIGRATE every key, then SETSLOT NODE on every primary. ``finish=False`` stops
        after MIGRATING (the slot is mid-migration: the source answers ASK for keys it
        no longer has); ``finish_migration`` completes it later."""
        source = self.owner_of(slot)
        if source == to_port:
            raise RedisServerError(f"slot {slot} is already on {to_port}")
        self.cli(to_port, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        self.cli(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(to_port))
        self._pending = (slot, source, to_port)
        if finish:
            self.finish_migration()

    def move_keys(self, slot: int, source: int, target: int) -> None:
        """MIGRATE every key of ``slot`` from ``source`` to ``target`` (in batches)."""
        while True:
            keys = self.cli(source, "CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                return
            self.cli(source, "MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)

    def finish_migration(self) -> None:
        slot, source, target = self._pending
        self.move_keys(slot, source, target)
        target_id = self.node_id(target)
        # the target first, then the source, then the rest: the order redis-cli uses
        for port in [target, source, *(p for p in self.primaries() if p not in (source, target))]:
            self.cli(port, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        self._until(lambda: all(self.owner_of(slot, port) == target
                                for port, node in self.nodes.items()
                                if node._process is not None and not node.exited()),
                    READY_TIMEOUT, f"every node to see slot {slot} on {target}")

    def stop(self) -> None:
        """Stop every node (SIGTERM by PID, SIGKILL after a timeout) and remove its dir."""
        for node in self.nodes.values():
            node.stop()

    def _any_running(self) -> int:
        for port, node in self.nodes.items():
            if node._process is not None and not node.exited():
                return port
        raise RedisServerError("no node of the cluster is running")

    @staticmethod
    def _until(condition: Any, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                result = condition()
            except (OSError, hiredis.ReplyError) as error:  # a node restarting, or not ready
                last, result = error, None
            if result:
                return result
            time.sleep(0.05)  # polling processes we do not own an event from; bounded
        raise RedisServerError(f"waited {timeout} s for {what} (last error: {last})")
