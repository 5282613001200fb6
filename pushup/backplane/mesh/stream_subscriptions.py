"""Durable Streams subscriptions (protocol §6–7) on the mesh: one node, the
home, holds them all; the others tell it what their streams do.

The home is the owner of the path ``/v1/stream/__ds/`` (:mod:`owners`), so
every node names the same one from the ``--peer`` list alone, and every
client request under ``__ds/`` is handed on to it as a stream's request is
to the stream's owner. Its desk (:mod:`pushup.http.stream_subscriptions`)
reaches the other nodes' streams by hops signed with the cluster secret:

- ``GET __ds/_nodes/tails`` asks a node the tails of the streams it serves
  (a subscription's backfill); being asked also tells the node that
  subscriptions exist, so it tells the home its streams' changes again;
- an append of a pull-wake's wake event goes to the wake stream's owner as
  a client's append would, marked ``subscriptions`` (no token needed);
- ``POST __ds/_nodes/heard`` is how every other node tells the home what the
  streams it serves did (made, appended to, deleted): the changes since the
  last batch, one entry a stream, one batch in flight. The home answers how
  many subscriptions it holds; at none the node stops telling until asked
  for its tails again. While the home does not answer, the batch waits
  (still one entry a stream, so bounded by the streams this node serves)
  and is sent again each second; the log says the home lost and back once.

A member that does not answer a backfill is left out of it: its streams
that match a new subscription's pattern are linked when they next change,
from their first byte, as a stream made after the subscription is (§6.2);
docs/api.md says so. The home's death takes the subscription APIs with it
(503, as its streams) until it is back; with ``--data-dir`` it keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.client import readBody
from twisted.web.iweb import IResponse

from pushup.backplane import Relayed
from pushup.backplane.mesh.owners import SUBSCRIPTIONS
from pushup.backplane.mesh.stream_routes import StreamRoutes
from pushup.backplane.stream_engine import StreamRequest
from pushup.core import errors
from pushup.core.errors import PushUpError
from pushup.core.stream_values import START, Append, Position, parse_offset
from pushup.core.streams import Streams

log = Logger(namespace="pushup")
HOME = "/v1/stream/__ds/"  # the path whose owner is the home
TAILS = b"/v1/stream/__ds/_nodes/tails"
HEARD = b"/v1/stream/__ds/_nodes/heard"
RETRY_S = 1.0  # a batch the home did not take goes again after this
_JSON = b"application/json"
# one change of a stream, as a batch carries it: ("heard", tail, created,
# start) or ("gone",)
Change = tuple[Any, ...]


class Desk(Protocol):
    """The home's desk (pushup.http.stream_subscriptions.SubscriptionDesk), as
    far as we use it: the news of a stream, and how many subscriptions it holds."""

    def heard(self, path: str, tail: Position, created: bool = False,
              start: Position = START) -> None: ...

    def gone(self, path: str) -> None: ...

    def __len__(self) -> int: ...


class MeshSubscriptions:
    """This node's part: the home's reach into the mesh (``tails``,
    ``append``), the news it is told (``heard``, ``gone``: the desk's at the
    home, a batch to the home elsewhere), and the hops it answers
    (``internal``)."""

    complete = False  # a member that does not answer is left out of tails()

    def __init__(self, routes: StreamRoutes, streams: Streams, now: Callable[[], int]) -> None:
        self.routes = routes
        self.streams = streams
        self.now = now
        self.home = routes.owner(HOME)
        self.is_home = self.home == routes.me
        self.desk: Desk | None = None  # the home's desk, once it serves them
        self.telling = True  # told the home our streams' changes (until it says it holds none)
        self._pending: dict[str, Change] = {}
        self._sending = False
        self._retry: Any = None
        self._home_lost = False
        self.news_sent = 0  # batches the home took (/stats)

    # -- the home's reach --------------------------------------------------------

    def tails(self, now: int) -> defer.Deferred[dict[str, Position]]:
        """Every member's streams' tails (those that answer)."""
        asked = [self.routes.relay.send(node, SUBSCRIPTIONS, b"GET", TAILS)
                 for node in self.routes.members if node != self.routes.me]
        gathered = defer.DeferredList([d.addCallback(_json_of) for d in asked],
                                      consumeErrors=True)

        def merged(answers: list[tuple[bool, Any]]) -> dict[str, Position]:
            tails = dict(self.streams.tails(now))
            for ok, value in answers:
                if ok and isinstance(value, dict):
                    tails.update({str(path): parse_offset(str(offset))
                                  for path, offset in value.items()})
            return tails

        return gathered.addCallback(merged)

    def append(self, path: str, event: bytes, now: int) -> defer.Deferred[Position]:
        """A wake event on its stream's owner (here, or handed on)."""
        owner = self.routes.owner(path)
        if owner == self.routes.me:
            try:
                done = self.streams.append(path, Append("application/json", event, False,
                                                        None, None), now)
            except PushUpError as e:
                return defer.fail(e)
            return defer.succeed(done.tail)
        sent = self.routes.relay.send(owner, SUBSCRIPTIONS, b"POST", path.encode("latin-1"),
                                      fields={b"content-type": _JSON}, body=event)

        def answered(response: IResponse) -> defer.Deferred[Position]:
            def read(body: bytes) -> Position:
                offset = response.headers.getRawHeaders(b"stream-next-offset")
                if response.code not in (200, 204) or not offset:
                    raise errors.EngineUnavailable(
                        f"the wake stream's node answered {response.code}: {body[:200]!r}")
                return parse_offset(offset[0].decode("latin-1"))
            return readBody(response).addCallback(read)

        return sent.addCallback(answered)

    # -- the news of this node's streams -------------------------------------------

    def heard(self, path: str, tail: Position, created: bool = False,
              start: Position = START) -> None:
        if self.is_home:
            if self.desk is not None:
                self.desk.heard(path, tail, created, start)
            return
        if not self.telling:
            return
        known = self._pending.get(path)
        if known is not None and known[0] == "heard" and known[2]:
            created, start = True, known[3]  # made, then appended to: made, with its start
        self._pending[path] = ("heard", tail, created, start)
        self._send()

    def gone(self, path: str) -> None:
        if self.is_home:
            if self.desk is not None:
                self.desk.gone(path)
            return
        if self.telling:
            self._pending[path] = ("gone",)
            self._send()

    def _send(self) -> None:
        if self._sending or self._retry is not None or not self._pending:
            return
        batch, self._pending = self._pending, {}
        self._sending = True
        body = json.dumps([[path, *_wire(change)] for path, change in batch.items()],
                          separators=(",", ":")).encode()
        sent = self.routes.relay.send(self.home, SUBSCRIPTIONS, b"POST", HEARD,
                                      fields={b"content-type": _JSON}, body=body)
        sent.addCallback(_json_of).addCallbacks(self._taken, self._not_taken,
                                                errbackArgs=(batch,))

    def stats(self) -> dict[str, int]:
        """/stats ``stream_subscriptions``' cluster figures."""
        return {"home": int(self.is_home), "telling": int(self.telling and not self.is_home),
                "news_sent": self.news_sent}

    def _taken(self, answer: object) -> None:
        self._sending = False
        self.news_sent += 1
        if self._home_lost:
            self._home_lost = False
            log.info("stream subscriptions: the home {home} takes this node's news again",
                     home=self.home)
        held = answer.get("subscriptions", 0) if isinstance(answer, dict) else 0
        if not held:  # until a subscription's backfill asks our tails
            self.telling = False
            self._pending.clear()
        self._send()

    def _not_taken(self, failure: Failure, batch: dict[str, Change]) -> None:
        self._sending = False
        for path, change in self._pending.items():  # what changed since is newer
            batch.pop(path, None)
            batch[path] = change
        self._pending = batch
        if not self._home_lost:
            self._home_lost = True
            log.warn("stream subscriptions: the home {home} did not take this node's news "
                     "({why}); sending it again every {retry:g} s", home=self.home,
                     why=failure.getErrorMessage(), retry=RETRY_S)
        self._retry = self.routes.relay.clock.callLater(RETRY_S, self._again)

    def _again(self) -> None:
        self._retry = None
        self._send()

    def start(self) -> None:
        """Nothing to start on the mesh: the home is known from the members."""

    def stop(self) -> None:
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None

    # -- the hops this node answers ------------------------------------------------

    def serve(self, here: Callable[[], object], request: StreamRequest,
              client: object) -> object:
        """A client's request under ``__ds/``, served on the home."""
        return self.routes.serve([HOME], here, request, client)

    def internal(self, request: StreamRequest, rest: bytes) -> Relayed | None:
        """A node's own question under ``__ds/_nodes/`` answered, or None: a
        client's request (handed on to the home). 401 if wrongly signed."""
        if not rest.startswith(b"_nodes/") or self.routes.hop(request) != SUBSCRIPTIONS:
            return None
        if rest == b"_nodes/tails" and request.method == b"GET":
            self.telling = True
            tails = self.streams.tails(self.now())
            return _answer({path: tail.offset for path, tail in tails.items()})
        if rest == b"_nodes/heard" and request.method == b"POST" and self.is_home:
            return _answer({"subscriptions": self._take(request.body)})
        raise errors.NotFound("no such question between nodes")

    def _take(self, body: bytes) -> int:
        """A batch of another node's news, told the desk; the subscriptions held."""
        try:
            batch = json.loads(body)
            changes = [(str(each[0]), each[1:]) for each in batch]
        except (ValueError, TypeError, IndexError, KeyError):
            raise errors.BadJSON("a batch of news is [[path, kind, ...], ...]") from None
        desk = self.desk
        for path, change in changes:
            if desk is None:
                break
            if change[0] == "gone":
                desk.gone(path)
            elif change[0] == "heard":
                try:
                    desk.heard(path, parse_offset(change[1]), bool(change[2]),
                               parse_offset(change[3]))
                except (PushUpError, IndexError):
                    raise errors.BadJSON("a heard change is [path, \"heard\", tail, "
                                         "created, start]") from None
        return 0 if desk is None else len(desk)


def _wire(change: Change) -> list[object]:
    if change[0] == "gone":
        return ["gone"]
    _, tail, created, start = change
    return ["heard", tail.offset, created, start.offset]


def _json_of(response: IResponse) -> defer.Deferred[object]:
    """The JSON of a 200 answer; an ``EngineUnavailable`` for any other."""
    def read(body: bytes) -> object:
        if response.code != 200:
            raise errors.EngineUnavailable(f"answered {response.code}: {body[:200]!r}")
        return json.loads(body)
    return readBody(response).addCallback(read)


def _answer(value: object) -> Relayed:
    return Relayed(200, _JSON, ((b"cache-control", b"no-store"),),
                   json.dumps(value, separators=(",", ":")).encode())
