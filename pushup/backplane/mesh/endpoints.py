"""The mesh's endpoints, behind ``/peer/``: what a peer's request does here.

Each request is checked against the cluster secret (an HMAC over method,
path, time and body: :mod:`pushup.backplane.mesh.wire`), then handed to the
mesh. The HTTP layer routes ``/peer/`` requests here as ``PeerRequest``
values and renders the ``PeerAnswer``; this module reads no socket.
"""

from __future__ import annotations

from twisted.internet.interfaces import IProtocol

from pushup.backplane import PeerAnswer, PeerRequest, unsigned
from pushup.backplane.mesh.mesh import Cluster
from pushup.backplane.mesh.stream import PeerStream
from pushup.backplane.mesh.wire import decode_batch, verify
from pushup.core import errors
from pushup.core.follow import Applied
from pushup.core.model import dumps


class MeshEndpoints:
    """``GET /peer/stream`` upgraded (the replication stream: batches in,
    :mod:`pushup.backplane.mesh.stream`), ``POST /peer/messages`` (a batch in,
    as nodes before the stream sent them; still answered), ``GET /peer/snapshot`` (everything
    we hold, for a joining node), ``POST /peer/repair`` (a batch a peer lacks).
    Every refusal is counted in ``cluster.refused`` (``peer_refused`` in /stats)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def admits(self, signed: bool) -> bool:
        if signed and self.cluster.secret:
            return True
        self.cluster.refused += 1
        return False

    def stream(self) -> IProtocol:
        return PeerStream(self.cluster)

    def answer(self, request: PeerRequest, now: float) -> PeerAnswer:
        cluster = self.cluster
        if not (cluster.secret and verify(cluster.secret, request.method, request.path,
                                          request.time, request.body, request.signature, now)):
            cluster.refused += 1
            raise unsigned()
        if (request.method, request.path) == ("POST", "/peer/messages"):
            try:
                received = cluster.receive(decode_batch(request.body))
            except errors.BadRequest:
                cluster.refused += 1
                raise
            if isinstance(received, Applied):
                return PeerAnswer(200, dumps({"horizon": received.horizon}))
            return PeerAnswer(409, dumps({"expected": received.expected}))
        if (request.method, request.path) == ("GET", "/peer/snapshot"):
            return PeerAnswer(200, cluster.snapshot())
        if (request.method, request.path) == ("POST", "/peer/repair"):
            batch = cluster.repair(request.body)
            return PeerAnswer(204) if batch is None else PeerAnswer(200, batch)
        raise errors.NotFound(f"no such path: {request.path[:100]}")
