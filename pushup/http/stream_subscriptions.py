"""Durable Streams subscriptions over HTTP (protocol §6–7): the reserved
``/v1/stream/__ds/`` paths, and the wakes they deliver.

Routes, each answered with PushUp's JSON error body on a bad request:

- ``GET __ds/jwks.json``: the webhook signing keys (§6.5);
- ``PUT|GET|DELETE __ds/subscriptions/:id`` (§6.2–6.3);
- ``POST __ds/subscriptions/:id/streams``, ``DELETE …/streams/:path`` (§6.4);
- ``POST …/:id/callback`` (webhook), ``…/claim``, ``…/ack``, ``…/release``
  (pull-wake) (§7).

Any other path under ``__ds/`` is reserved: no stream is made there. The
subscriptions' state is :mod:`pushup.core.subscriptions`' (pure); this
module moves it: it hears each stream's new tail from the stream endpoints
(``heard``, ``gone``), starts the wakes that pending work asks for on the
next turn of the reactor (a burst of appends wakes once), POSTs a webhook's
wake through the injected ``sender`` and backs off when it fails, appends a
pull-wake's wake event to its wake stream, and keeps one timer per
subscription (a retry or its lease's end). Callback and claim tokens are
HS256 JWTs (PyJWT) naming the subscription, its generation and wake.
"""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import unquote

import jwt
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.backplane import Relayed
from pushup.core import errors
from pushup.core.errors import BadRequest, PushUpError, Unauthorized, WebhookUrlRejected
from pushup.core.service import Service
from pushup.core.stream_values import START, Append, Position
from pushup.core.streams import Streams
from pushup.core.subscriptions import (
    PULL_WAKE,
    WEBHOOK,
    Definition,
    Event,
    Phase,
    Registry,
    Subscription,
    Wake,
    definition,
    link_view,
    state_of,
    stream_paths,
    subscription_id,
    subscription_of,
    webhook_url_problem,
)
from pushup.http.exchange import Request, Response, error_response

log = Logger(namespace="pushup")
CONTROL = b"__ds/"
TOKEN_LIFE_S = 3600  # a callback or claim token's life; fencing ends it sooner
_JSON = b"application/json"
_NO_STORE = ((b"Cache-Control", b"no-store"),)
Answer = Response | defer.Deferred[Response]  # a request's answer: now, or when the streams told


class Reach(Protocol):
    """The streams a desk links and wakes: this node's alone
    (``LocalReach``), or a cluster's (:mod:`pushup.backplane.mesh.stream_subscriptions`)."""

    complete: bool  # tails() names every stream, so a path it lacks was deleted

    def tails(self, now: int) -> defer.Deferred[dict[str, Position]]:
        """Every stream's tail, by its path (as the streams' core keys it)."""

    def append(self, path: str, event: bytes, now: int) -> defer.Deferred[Position]:
        """A wake event appended to the stream at ``path``: its new tail (a
        ``PushUpError`` when it refused)."""


class LocalReach:
    """The streams of this node alone (its core's)."""

    complete = True

    def __init__(self, streams: Streams) -> None:
        self.streams = streams

    def tails(self, now: int) -> defer.Deferred[dict[str, Position]]:
        return defer.succeed(self.streams.tails(now))

    def append(self, path: str, event: bytes, now: int) -> defer.Deferred[Position]:
        try:
            done = self.streams.append(path, Append("application/json", event, False, None,
                                                    None), now)
        except PushUpError as e:
            return defer.fail(e)
        return defer.succeed(done.tail)


class StreamNews(Protocol):
    """Who hears what the streams this node serves do (the desk, or a
    cluster's part that tells the node holding the subscriptions)."""

    def heard(self, path: str, tail: Position, created: bool = False,
              start: Position = START) -> None: ...

    def gone(self, path: str) -> None: ...


class ClusterPart(Reach, StreamNews, Protocol):
    """A cluster's side of the subscriptions (the mesh's: one node holds
    them, the others tell it their news): the desk's reach, the news of
    this node's streams, and the questions the nodes ask each other."""

    desk: Any  # the desk this node serves them with, once made

    def internal(self, request: Request, rest: bytes) -> Relayed | None:
        """A node's own question under ``__ds/`` answered, or None (a client's)."""

    def serve(self, here: Callable[[], object], request: Request, client: object) -> object:
        """A client's request under ``__ds/``: ``here()`` on the node that
        holds the subscriptions, else that node's answer (as
        ``StreamEngine.serve`` gives it)."""


class Sender(Protocol):
    def send(self, url: str, body: bytes) -> defer.Deferred[tuple[int, bytes]]: ...

    def stats(self) -> dict[str, int]: ...


class Keeper(Protocol):
    """Where subscriptions are kept across restarts (``--data-dir``)."""

    def subscriptions(self) -> dict[str, dict[str, Any]]: ...

    def subscription_kept(self, sub_id: str, state: dict[str, object] | None) -> None: ...


class SigningKey(Protocol):
    @property
    def kid(self) -> str: ...

    @property
    def jwks(self) -> dict[str, list[dict[str, str]]]: ...

    @property
    def token_secret(self) -> bytes: ...


def _json(status: int, value: object, headers: tuple[tuple[bytes, bytes], ...] = _NO_STORE,
          content_type: bytes = _JSON) -> Response:
    return Response(status, json.dumps(value, separators=(",", ":")).encode(), content_type,
                    headers)


class SubscriptionDesk:
    """Every subscription of this node, its routes and its wakes."""

    def __init__(self, service: Service, reach: Reach, prefix: str, key: SigningKey,
                 sender: Sender, authorize: Callable[[Request], None],
                 authorize_read: Callable[[Request], None],
                 keeper: Keeper | None = None) -> None:
        """``prefix``: the streams' root (``/v1/stream/``); ``key``: what
        signs the webhooks (its ``token_secret``, the wakes' tokens); ``authorize``: the
        publish token's guard (control requests), ``authorize_read`` the
        readers' (GET); ``keeper``: where the subscriptions are kept (they
        are read back from it now, their timers armed again)."""
        self.service = service
        self.reach = reach
        self.prefix = prefix
        self.key = key
        self.sender = sender
        self._authorize = authorize
        self._authorize_read = authorize_read
        self.registry = Registry()
        self._due: set[str] = set()
        self._pump: Any = None
        self._timers: dict[str, Any] = {}
        self._failing: set[str] = set()  # said once in the log per outage
        self._bases: dict[str, str] = {}  # each subscription's root URL, as its PUT named it
        self._random = random.Random()
        self.wakes = 0  # wakes begun (/stats)
        self.stopped = False  # another node holds them now (``stop``)
        self.keeper = keeper
        if keeper is not None:
            self._restore(keeper)

    def __len__(self) -> int:
        """The subscriptions held."""
        return len(self.registry)

    def _restore(self, keeper: Keeper) -> None:
        """The kept subscriptions, with the tails this node has now (a
        cluster's others tell theirs as their streams change)."""
        kept = keeper.subscriptions()
        if kept:
            self._relative_tails().addCallback(self._restored, kept, self.reach.complete)

    def _restored(self, tails: dict[str, Position], kept: dict[str, dict[str, Any]],
                  complete: bool) -> None:
        if self.stopped:
            return
        now = self.service.now()
        for sub_id, state in kept.items():
            sub = subscription_of(sub_id, state, tails, now, complete)
            self.registry.subscriptions[sub_id] = sub
            self._bases[sub_id] = state.get("base", "http://localhost" + self.prefix)
            self._arm(sub)
            if sub.pending:
                self._wake_later(sub_id)
        if self.registry.subscriptions:
            log.info("stream subscriptions: {n} read back from the data directory",
                     n=len(self.registry))

    def _keep(self, sub: Subscription, deleted: bool = False) -> None:
        """Keep ``sub``'s state (with ``--data-dir``); a disk that refuses
        it leaves the change in memory only (said in the log)."""
        if self.keeper is None:
            return
        try:
            self.keeper.subscription_kept(
                sub.id, None if deleted else {**state_of(sub), "base": self._bases.get(sub.id)})
        except PushUpError as e:
            log.warn("stream subscription {id}: not kept on disk ({why})", id=sub.id,
                     why=e.message)

    # -- what the stream endpoints tell ------------------------------------------

    def heard(self, path: str, tail: Position, created: bool = False,
              start: Position = START) -> None:
        """The stream at ``path`` (as the streams' core keys it) has ``tail``;
        ``created``: made now, its data from ``start`` on its own (a fork's
        inherited data is not pending)."""
        if not self.registry.subscriptions:
            return
        relative = path[len(self.prefix):]
        for sub in self.registry.heard(relative, tail, created, start):
            self._wake_later(sub.id)

    def gone(self, path: str) -> None:
        if self.registry.subscriptions:
            self.registry.gone(path[len(self.prefix):])

    # -- routes ----------------------------------------------------------------

    def answer(self, request: Request, rest: bytes) -> Answer:
        """``request`` to ``{prefix}__ds/{rest}``, answered now or later
        (errors included)."""
        try:
            answer = self._route(request, rest.decode("latin-1"))
        except PushUpError as e:
            return error_response(e)
        if isinstance(answer, defer.Deferred):
            answer.addErrback(_refused)
        return answer

    def _route(self, request: Request, rest: str) -> Answer:
        method = request.method
        if rest == "jwks.json":
            _allow(method, (b"GET",))
            return _json(200, self.key.jwks, ((b"Cache-Control", b"public, max-age=300"),),
                         b"application/jwk-set+json")
        parts = rest.split("/", 2)
        if parts[0] != "subscriptions" or len(parts) < 2:
            raise BadRequest("paths under __ds/ are reserved for the subscription APIs "
                             "(__ds/subscriptions/:id, __ds/jwks.json)")
        sub_id = subscription_id(parts[1])
        action = parts[2] if len(parts) > 2 else ""
        if action == "":
            _allow(method, (b"PUT", b"GET", b"DELETE"))
            if method == b"GET":
                self._authorize_read(request)
                return _json(200, self._view(self.registry.get(sub_id), request))
            self._authorize(request)
            if method == b"PUT":
                return self._put(sub_id, request)
            self._delete(sub_id)
            return Response(204, headers=_NO_STORE)
        if action == "streams" or action.startswith("streams/"):
            self._authorize(request)
            sub = self.registry.get(sub_id)
            if action == "streams":
                _allow(method, (b"POST",))
                paths = stream_paths(_field(_body(request), "streams"), "streams")

                def add(tails: dict[str, Position]) -> Response:
                    if self.registry.subscriptions.get(sub_id) is not sub:
                        raise errors.NotFound(f"subscription {sub_id} was deleted meanwhile")
                    sub.add_explicit(paths, tails)
                    self._keep(sub)
                    return Response(204, headers=_NO_STORE)
                return self._relative_tails().addCallback(add)
            _allow(method, (b"DELETE",))
            sub.remove_explicit(unquote(action[len("streams/"):]))
            self._keep(sub)
            return Response(204, headers=_NO_STORE)
        _allow(method, (b"POST",))
        sub = self.registry.get(sub_id)
        if action == "callback":
            return self._callback(sub, request, WEBHOOK)
        if action == "claim":
            self._authorize(request)
            return self._claim(sub, request)
        if action == "ack":
            return self._callback(sub, request, PULL_WAKE)
        if action == "release":
            return self._release(sub, request)
        raise errors.NotFound(f"no subscription API {action[:40]!r}")

    def _relative_tails(self) -> defer.Deferred[dict[str, Position]]:
        """Every stream's tail, by its path under the streams' root."""
        n = len(self.prefix)
        told = self.reach.tails(self.service.now())
        return told.addCallback(lambda tails: {path[n:]: tail for path, tail in tails.items()})

    def _put(self, sub_id: str, request: Request) -> Answer:
        spec = definition(_body(request))
        if spec.webhook_url is not None:
            problem = webhook_url_problem(spec.webhook_url)
            if problem is not None:
                raise WebhookUrlRejected(f"webhook URL refused: {problem}")
        known = self.registry.subscriptions.get(sub_id)
        if known is not None:  # the same again (200) or another definition (409): no backfill
            return self._made(self.registry.put(sub_id, spec, {}, self.service.now()), spec,
                              request)
        return self._relative_tails().addCallback(
            lambda tails: self._made(self.registry.put(sub_id, spec, tails, self.service.now()),
                                     spec, request))

    def _made(self, put: tuple[Subscription, bool], spec: Definition, request: Request) -> Response:
        sub, created = put
        sub_id = sub.id
        if created:
            self._bases[sub_id] = self._url(request, "")
            self._keep(sub)
            log.info("stream subscription {id} created ({kind}, {links} streams linked)",
                     id=sub_id, kind=spec.kind, links=len(sub.links))
            if sub.pending:
                self._wake_later(sub_id)
        return _json(201 if created else 200, self._view(sub, request))

    def _delete(self, sub_id: str) -> None:
        self._keep(self.registry.delete(sub_id), deleted=True)
        self._due.discard(sub_id)
        self._failing.discard(sub_id)
        self._bases.pop(sub_id, None)
        timer = self._timers.pop(sub_id, None)
        if timer is not None and timer.active():
            timer.cancel()
        log.info("stream subscription {id} deleted", id=sub_id)

    def _url(self, request: Request, rest: str) -> str:
        host = request.headers.get(b"host", b"localhost").decode("latin-1")
        return f"http://{host}{self.prefix}{rest}"

    def _view(self, sub: Subscription, request: Request) -> dict[str, object]:
        spec = sub.spec
        webhook: dict[str, object] | None = None
        if spec.webhook_url is not None:
            webhook = {"url": spec.webhook_url,
                       "signing": {"alg": "ed25519", "kid": self.key.kid,
                                   "jwks_url": self._url(request, "__ds/jwks.json")}}
        return {"id": sub.id, "subscription_id": sub.id, "type": spec.kind,
                "pattern": spec.pattern,
                "streams": [link_view(path, link, False) for path, link in
                            sorted(sub.links.items())],
                "webhook": webhook, "wake_stream": spec.wake_stream,
                "lease_ttl_ms": spec.lease_ttl_ms, "created_at": _iso(sub.created_at),
                "status": sub.status, "description": spec.description}

    # -- callback, claim, ack, release ---------------------------------------------

    def _token(self, sub: Subscription, wake: Wake) -> str:
        now_s = self.service.now() // 1_000_000
        return jwt.encode({"sub": sub.id, "made": sub.created_at, "gen": wake.generation,
                           "wake": wake.wake_id, "exp": now_s + TOKEN_LIFE_S},
                          self.key.token_secret, algorithm="HS256")

    def _bearer(self, sub: Subscription, request: Request) -> int:
        """The generation the request's token is for; 401 for none or another
        subscription's."""
        given = request.headers.get(b"authorization", b"").decode("latin-1")
        if not given.startswith("Bearer "):
            raise Unauthorized("give the wake's token: Authorization: Bearer <token>")
        try:
            claims = jwt.decode(given[7:].strip(), self.key.token_secret, algorithms=["HS256"],
                                options={"require": ["sub", "gen", "exp"]})
        except jwt.PyJWTError as e:
            raise Unauthorized(f"the wake's token is not valid: {e}") from None
        if claims.get("sub") != sub.id or claims.get("made") != sub.created_at \
                or not isinstance(claims.get("gen"), int):
            raise Unauthorized("the token is another subscription's")
        generation: int = claims["gen"]
        return generation

    def _callback(self, sub: Subscription, request: Request, kind: str) -> Response:
        if sub.spec.kind != kind:
            raise errors.NotFound(f"subscription {sub.id} is a {sub.spec.kind} subscription")
        token_generation = self._bearer(sub, request)
        body = _body(request)
        now = self.service.now()
        sub.fenced(body.get("wake_id"), body.get("generation"), token_generation)
        done = body.get("done", False)
        if not isinstance(done, bool):
            raise BadRequest("done is true or false")
        next_wake = sub.finish(body.get("acks", []), done, now)
        self._keep(sub)
        if done:
            self._ended(sub)
        else:
            self._arm(sub)
        return _json(200, {"ok": True, "next_wake": next_wake if done else False})

    def _claim(self, sub: Subscription, request: Request) -> Response:
        if sub.spec.kind != PULL_WAKE:
            raise errors.NotFound(f"subscription {sub.id} is a webhook subscription")
        worker = _field(_body(request), "worker")
        if not isinstance(worker, str) or not worker or len(worker) > 256:
            raise BadRequest("worker is the claiming worker's name (1 to 256 characters)")
        now = self.service.now()
        if sub.phase is Phase.IDLE:  # claimed before (or without) a wake event
            self._begin(sub, now)
        wake = sub.claim(worker, now)
        self._keep(sub)
        self._arm(sub)
        log.debug("stream subscription {id}: generation {gen} claimed by {worker}",
                  id=sub.id, gen=wake.generation, worker=worker)
        return _json(200, {"wake_id": wake.wake_id, "generation": wake.generation,
                           "token": self._token(sub, wake),
                           "streams": [link_view(path, sub.links[path], True)
                                       for path in sorted(wake.snapshot)],
                           "lease_ttl_ms": sub.spec.lease_ttl_ms})

    def _release(self, sub: Subscription, request: Request) -> Response:
        if sub.spec.kind != PULL_WAKE:
            raise errors.NotFound(f"subscription {sub.id} is a webhook subscription")
        token_generation = self._bearer(sub, request)
        body = _body(request)
        sub.fenced(body.get("wake_id"), body.get("generation"), token_generation)
        sub.move(Event.RELEASE)
        self._keep(sub)
        self._ended(sub)
        return Response(204, headers=_NO_STORE)

    def _ended(self, sub: Subscription) -> None:
        """A wake ended: its timer goes; pending work wakes again."""
        self._arm(sub)
        if sub.pending:
            self._wake_later(sub.id)

    # -- wakes -----------------------------------------------------------------

    def _wake_later(self, sub_id: str) -> None:
        self._due.add(sub_id)
        if self._pump is None:
            self._pump = self.service.clock.callLater(0, self._wake_due)

    def _wake_due(self) -> None:
        self._pump = None
        due, self._due = self._due, set()
        now = self.service.now()
        for sub_id in sorted(due):
            sub = self.registry.subscriptions.get(sub_id)
            if sub is None or sub.phase is not Phase.IDLE or not sub.pending:
                continue
            self._begin(sub, now)
            if sub.spec.kind == WEBHOOK:
                self._deliver(sub)
            else:
                self._write_wake(sub, now)

    def _begin(self, sub: Subscription, now: int) -> Wake:
        self.wakes += 1
        wake = sub.begin_wake("w_" + secrets.token_hex(8), now)
        self._keep(sub)
        return wake

    def _write_wake(self, sub: Subscription, now: int) -> None:
        """A pull-wake's wake event, appended to its wake stream (§7.2)."""
        wake = sub.wake
        assert wake is not None and sub.spec.wake_stream is not None
        first = min(wake.snapshot) if wake.snapshot else None
        event = json.dumps({"type": "wake", "subscription_id": sub.id, "stream": first,
                            "generation": wake.generation, "ts": now // 1000},
                           separators=(",", ":")).encode()
        path = self.prefix + sub.spec.wake_stream
        written = self.reach.append(path, event, now)
        written.addCallbacks(self._wake_written, self._wake_refused, (sub, path),
                             errbackArgs=(sub, wake))

    def _wake_written(self, tail: Position, sub: Subscription, path: str) -> None:
        self._failing.discard(sub.id)
        self.heard(path, tail)

    def _wake_refused(self, failure: Failure, sub: Subscription, wake: Wake) -> None:
        if not isinstance(failure.value, PushUpError):
            log.failure("stream subscription {id}: writing its wake failed", failure,
                        id=sub.id)
        if self.registry.subscriptions.get(sub.id) is not sub or sub.wake is not wake \
                or sub.phase is not Phase.WAKE_WRITTEN:
            return  # deleted, or claimed meanwhile: the claim holds the work
        sub.move(Event.FAILED)
        self._keep(sub)
        if sub.id not in self._failing:
            self._failing.add(sub.id)
            why = failure.value.message if isinstance(failure.value, PushUpError) \
                else type(failure.value).__name__
            log.warn("stream subscription {id}: its wake stream {path} refused the "
                     "wake ({why}); woken again at the next append",
                     id=sub.id, path=sub.spec.wake_stream, why=why)

    def _deliver(self, sub: Subscription) -> None:
        wake = sub.wake
        assert wake is not None and sub.spec.webhook_url is not None
        wake.attempts += 1
        body = json.dumps({
            "subscription_id": sub.id, "wake_id": wake.wake_id, "generation": wake.generation,
            "streams": [link_view(path, sub.links[path], True) for path in
                        sorted(wake.snapshot) if path in sub.links],
            "callback_url": self._callback_url(sub),
            "callback_token": self._token(sub, wake)}, separators=(",", ":")).encode()
        sent = self.sender.send(sub.spec.webhook_url, body)
        sent.addCallbacks(self._answered, self._failed, (sub, wake.wake_id),
                          errbackArgs=(sub, wake.wake_id))

    def _callback_url(self, sub: Subscription) -> str:
        base = self._bases.get(sub.id, "http://localhost" + self.prefix)
        return f"{base}__ds/subscriptions/{sub.id}/callback"

    def _answered(self, answer: tuple[int, bytes], sub: Subscription, wake_id: str) -> None:
        status, body = answer
        if not 200 <= status < 300:
            self._back_off(sub, wake_id, f"answered {status}")
            return
        if self.registry.subscriptions.get(sub.id) is not sub:
            return  # deleted meanwhile
        done = False
        try:
            value = json.loads(body) if body.strip() else {}
            done = isinstance(value, dict) and value.get("done") is True
        except ValueError:
            pass
        if sub.id in self._failing:
            self._failing.discard(sub.id)
            log.info("stream subscription {id}: its webhook answers again", id=sub.id)
        sub.answered(wake_id, done, self.service.now())
        self._keep(sub)
        if sub.phase is Phase.IDLE:
            self._ended(sub)
        else:
            self._arm(sub)

    def _failed(self, failure: Failure, sub: Subscription, wake_id: str) -> None:
        self._back_off(sub, wake_id, str(failure.value) or type(failure.value).__name__)

    def _back_off(self, sub: Subscription, wake_id: str, why: str) -> None:
        """The POST of ``wake_id`` failed (``why``): tried again later."""
        if self.registry.subscriptions.get(sub.id) is not sub:
            return
        retry_at = sub.failed(wake_id, self._random.uniform(-1, 1), self.service.now())
        if retry_at is None:
            return
        self._keep(sub)  # its next_attempt_at, honoured after a restart (§7.1)
        if sub.id not in self._failing:
            self._failing.add(sub.id)
            log.warn("stream subscription {id}: webhook delivery failed ({why}); retrying "
                     "with backoff", id=sub.id, why=why)
        self._arm(sub)

    def _arm(self, sub: Subscription) -> None:
        """The subscription's one timer, at its next retry or its lease's end."""
        timer = self._timers.pop(sub.id, None)
        if timer is not None and timer.active():
            timer.cancel()
        wake = sub.wake
        if wake is None:
            return
        if sub.phase is Phase.RETRYING and wake.next_attempt_at is not None:
            at = wake.next_attempt_at
        elif sub.phase in (Phase.AWAITING, Phase.CLAIMED):
            at = wake.lease_until
        else:
            return
        delay = max(0.0, (at - self.service.now()) / 1e6)
        self._timers[sub.id] = self.service.clock.callLater(delay, self._timer, sub)

    def _timer(self, sub: Subscription) -> None:
        self._timers.pop(sub.id, None)
        if self.registry.subscriptions.get(sub.id) is not sub:
            return
        now = self.service.now()
        if sub.phase is Phase.RETRYING:
            sub.retry(now)
            self._keep(sub)
            self._deliver(sub)
        elif sub.expire(now):
            log.debug("stream subscription {id}: lease expired", id=sub.id)
            self._keep(sub)
            self._ended(sub)
        else:
            self._arm(sub)

    def stop(self) -> None:
        """This desk holds them no more (another node does now): its timers
        go, and answers still to come change nothing; nothing is kept."""
        for timer in self._timers.values():
            if timer.active():
                timer.cancel()
        self._timers.clear()
        if self._pump is not None and self._pump.active():
            self._pump.cancel()
        self._pump = None
        self._due.clear()
        self.registry.subscriptions.clear()
        self.stopped = True

    def stats(self) -> dict[str, int]:
        """/stats ``stream_subscriptions``."""
        subs = self.registry.subscriptions.values()
        return {"count": len(self.registry), "wakes": self.wakes,
                "retrying": sum(sub.phase is Phase.RETRYING for sub in subs),
                **self.sender.stats()}


def _refused(failure: Failure) -> Response:
    """A later answer that failed: a PushUpError is its answer; anything else
    is a bug, passed on for the front to log and answer 500."""
    if not isinstance(failure.value, PushUpError):
        return failure  # type: ignore[return-value]
    return error_response(failure.value)


def _allow(method: bytes, allowed: tuple[bytes, ...]) -> None:
    if method not in allowed:
        raise errors.MethodNotAllowed(f"{method.decode('latin-1')} is not allowed here",
                                      tuple(m.decode() for m in allowed))


def _body(request: Request) -> dict[str, Any]:
    try:
        value = json.loads(request.body or b"{}")
    except ValueError:
        raise errors.BadJSON("the body is not JSON") from None
    if not isinstance(value, dict):
        raise errors.BadJSON("the body is a JSON object")
    return value


def _field(body: dict[str, Any], name: str) -> object:
    if name not in body:
        raise BadRequest(f"{name} is missing")
    return body[name]


def _iso(us: int) -> str:
    import datetime

    moment = datetime.datetime.fromtimestamp(us / 1e6, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
