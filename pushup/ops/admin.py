"""``--admin-port``: /stats, /metrics and /health on a port of their own.

The figures name the peers and tell the load: with ``--admin-port`` they are
answered only here (bound to ``--admin-host``, loopback by default), and the
client port answers them 404. This front takes no body and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IProtocol

from pushup.core import errors
from pushup.core.errors import PushUpError
from pushup.core.model import dumps
from pushup.http.exchange import Held, Pending, Request, Response, error_response
from pushup.http.handlers import Client, Handlers


class AdminApp:
    """The admin port's ``App`` for the HTTP front (GET/HEAD of three paths)."""

    def __init__(self, handlers: Handlers, stats: Callable[[], dict[str, Any]],
                 metrics: Callable[[], tuple[bytes, bytes]]) -> None:
        self.handlers = handlers  # /health is the client port's own answer
        self._stats = stats
        self._metrics = metrics

    def admit(self, method: bytes, path: bytes, headers: dict[bytes, bytes]) -> int | Response:
        """No body; another path is refused before its body (and the connection closed)."""
        if path not in PATHS:
            return error_response(_elsewhere(), close=True)
        return 0

    def too_large(self, path: bytes) -> PushUpError:
        return errors.TooLarge("the admin port takes no request body")

    def upgrade(self, request: Request) -> IProtocol | None:
        return None

    def handle(self, request: Request, client: Client) -> Response | Held | Pending:
        path = request.path
        if path not in PATHS:
            return error_response(_elsewhere())
        if request.method not in (b"GET", b"HEAD"):
            return error_response(errors.MethodNotAllowed(
                f"{request.method.decode('latin-1')} is not allowed here", ("GET", "HEAD")))
        if path == b"/health":
            return self.handlers.handle(request, client)
        if path == b"/stats":
            return Response(200, dumps(self._stats()))
        content_type, text = self._metrics()
        return Response(200, text, content_type)


PATHS = (b"/stats", b"/metrics", b"/health")


def _elsewhere() -> PushUpError:
    return errors.NotFound("the admin port answers /stats, /metrics and /health only")
