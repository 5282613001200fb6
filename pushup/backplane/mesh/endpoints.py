"""The mesh's endpoints, mounted under ``/peer/``: what a peer's request does here.

``GET /peer/stream`` upgraded to ``pushup-peer`` is the replication stream
(batches in, :mod:`pushup.backplane.mesh.replication`; it authenticates itself);
``GET /peer/snapshot`` (everything we hold, for a joining node) and ``POST
/peer/repair`` (a batch a peer lacks, as MessagePack) are signed requests,
checked against the cluster secret (an HMAC over method, path, time and body:
:mod:`pushup.backplane.mesh.wire`) before their body is read. The HTTP front
hands them over through the seam's ``Mount`` and knows nothing of them; this
module reads no socket.
"""

from __future__ import annotations

from collections.abc import Mapping

from twisted.internet.interfaces import IProtocol

from pushup.backplane import EngineAnswer, EngineRequest
from pushup.backplane.mesh.mesh import Mesh
from pushup.backplane.mesh.presence import PATH as PRESENCE_PATH
from pushup.backplane.mesh.presence import MeshPresence
from pushup.backplane.mesh.replication import PATH as STREAM_PATH
from pushup.backplane.mesh.replication import PeerStream
from pushup.backplane.mesh.wire import PEER_BODY_LIMIT, verify
from pushup.core import errors

PREFIX = b"/peer/"


def unsigned() -> errors.PushUpError:
    """The one refusal of a request that is not a peer's."""
    return errors.Unauthorized("peer requests must be signed with the cluster secret")


class MeshEndpoints:
    """The mesh's ``Mount``. Every refusal is counted in ``mesh.refused``
    (``peer_refused`` in /stats)."""

    prefix = PREFIX
    body_limit = PEER_BODY_LIMIT

    def __init__(self, mesh: Mesh, presence: MeshPresence | None = None) -> None:
        self.mesh = mesh
        self.presence = presence  # POST /peer/presence, with --presence

    def admit(self, method: bytes, path: bytes, headers: Mapping[bytes, bytes]) -> int:
        if path == STREAM_PATH.encode():
            return 0  # an upgrade: the stream authenticates itself
        if b"x-pushup-signature" in headers and self.mesh.secret:
            return PEER_BODY_LIMIT
        self.mesh.refused += 1
        raise unsigned()

    def upgrade(self, request: EngineRequest) -> IProtocol | None:
        if (request.method, request.path) == (b"GET", STREAM_PATH.encode()) \
                and request.header(b"upgrade").lower() == "pushup-peer":
            return PeerStream(self.mesh)
        return None

    def answer(self, request: EngineRequest, now: float) -> EngineAnswer:
        mesh = self.mesh
        method, path = request.method.decode("latin-1"), request.path.decode("latin-1")
        endpoint = (method, path)
        presence = self.presence is not None and endpoint == ("POST", PRESENCE_PATH)
        if endpoint not in (("GET", "/peer/snapshot"), ("POST", "/peer/repair")) \
                and not presence:
            raise errors.NotFound(f"no such path: {path[:100]}")
        if not (mesh.secret and verify(mesh.secret, method, path,
                                       request.header(b"x-pushup-time"), request.body,
                                       request.header(b"x-pushup-signature"), now)):
            mesh.refused += 1
            raise unsigned()
        if presence:
            assert self.presence is not None
            return self.presence.receive(request.body)
        if endpoint == ("GET", "/peer/snapshot"):
            return EngineAnswer(200, mesh.snapshot())
        batch = mesh.repair(request.body)
        return EngineAnswer(204) if batch is None else EngineAnswer(200, batch)
