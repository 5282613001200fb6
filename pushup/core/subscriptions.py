"""Durable Streams subscriptions (protocol §6–7), as values: what a
subscription is, which streams it links and how far each is acked, and
where its wake is; every move of a wake is one row of ``MOVES``.

A subscription links streams by a glob ``pattern`` (``*`` one path segment,
``**`` zero or more) and by explicit ``streams``; each link holds the
stream's last acked offset and the tail this node last heard of. A link
whose tail is past its ack is pending. An idle subscription with pending
work is woken: a new ``generation`` and ``wake_id``, then (webhook) a
delivery, retried with backoff until a receiver answers, or (pull-wake) a
wake event for a worker to claim. A callback, ack or release is applied
only to the wake it names (``fenced``). A lease bounds how long a wake may
stay unfinished; past it the wake is dropped and, with work pending, the
next one begins.

Pure: no socket, no clock (``now`` is passed in, in microseconds, as the
streams' core takes it), no randomness (wake ids and jitter are given).
Paths here are stream-root-relative (``events/abc``), as the protocol's
bodies carry them. Errors are :mod:`pushup.core.errors`'.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final
from urllib.parse import urlsplit

from pushup.core.errors import (
    AlreadyClaimed,
    BadRequest,
    Fenced,
    NotFound,
    StreamsFull,
    SubscriptionConflict,
)
from pushup.core.stream_values import START, Position, parse_offset

WEBHOOK, PULL_WAKE = "webhook", "pull-wake"
LEASE_DEFAULT_MS = 30_000
LEASE_MIN_MS, LEASE_MAX_MS = 1_000, 600_000
RETRY_FIRST_S, RETRY_MOST_S, RETRY_JITTER = 1.0, 60.0, 0.2  # §7.1
MAX_STREAMS_GIVEN = 1_000  # explicit paths in one request
MAX_PATTERN = 1024  # bytes of a pattern (a stream path's most)
MAX_SUBSCRIPTIONS = 10_000  # a node's; past it a new one is 507
_ID = re.compile(r"[A-Za-z0-9._~-]{1,128}")


class Phase(Enum):
    IDLE = "idle"  # no wake: the next pending work begins one
    DELIVERING = "delivering"  # webhook: the wake's POST is under way
    RETRYING = "retrying"  # webhook: the POST failed; again at ``next_attempt_at``
    AWAITING = "awaiting"  # webhook: answered, not done; the callback ends it (or the lease)
    WAKE_WRITTEN = "wake_written"  # pull-wake: the wake event is in the wake stream
    CLAIMED = "claimed"  # pull-wake: a worker holds the lease


class Event(Enum):
    WAKE = "wake"  # pending work on an idle subscription
    ANSWERED = "answered"  # the receiver answered 2xx, not done
    FAILED = "failed"  # the POST failed (or was not sent)
    RETRY_DUE = "retry_due"
    DONE = "done"  # done: by the POST's answer, a callback, an ack
    HEARTBEAT = "heartbeat"  # a callback or ack without done: the lease goes on
    CLAIM = "claim"
    RELEASE = "release"
    LEASE_EXPIRED = "lease_expired"


_P, _E = Phase, Event
# (kind, phase, event) -> phase. A move not listed is refused: ``FENCED``
# for a request (it names no wake that is current), a bug otherwise.
MOVES: Final[dict[tuple[str, Phase, Event], Phase]] = {
    (WEBHOOK, _P.IDLE, _E.WAKE): _P.DELIVERING,
    (WEBHOOK, _P.DELIVERING, _E.ANSWERED): _P.AWAITING,
    (WEBHOOK, _P.DELIVERING, _E.FAILED): _P.RETRYING,
    (WEBHOOK, _P.DELIVERING, _E.DONE): _P.IDLE,  # the answer, or a callback before it
    (WEBHOOK, _P.DELIVERING, _E.HEARTBEAT): _P.DELIVERING,
    (WEBHOOK, _P.RETRYING, _E.RETRY_DUE): _P.DELIVERING,
    (WEBHOOK, _P.RETRYING, _E.DONE): _P.IDLE,  # a callback of a POST that timed out
    (WEBHOOK, _P.RETRYING, _E.HEARTBEAT): _P.AWAITING,
    (WEBHOOK, _P.AWAITING, _E.DONE): _P.IDLE,
    (WEBHOOK, _P.AWAITING, _E.HEARTBEAT): _P.AWAITING,
    (WEBHOOK, _P.AWAITING, _E.LEASE_EXPIRED): _P.IDLE,
    (PULL_WAKE, _P.IDLE, _E.WAKE): _P.WAKE_WRITTEN,
    (PULL_WAKE, _P.WAKE_WRITTEN, _E.FAILED): _P.IDLE,  # the wake stream refused it
    (PULL_WAKE, _P.WAKE_WRITTEN, _E.CLAIM): _P.CLAIMED,
    (PULL_WAKE, _P.CLAIMED, _E.HEARTBEAT): _P.CLAIMED,
    (PULL_WAKE, _P.CLAIMED, _E.DONE): _P.IDLE,
    (PULL_WAKE, _P.CLAIMED, _E.RELEASE): _P.IDLE,
    (PULL_WAKE, _P.CLAIMED, _E.LEASE_EXPIRED): _P.IDLE,
}


def glob_pattern(pattern: str) -> re.Pattern[str]:
    """``pattern`` as a regular expression over whole stream paths: ``*``
    one segment (no ``/``; within a segment, any run of characters), ``**``
    as a whole segment zero or more segments."""
    if not pattern or len(pattern) > MAX_PATTERN or pattern.startswith("/"):
        raise BadRequest("pattern is a non-empty stream-root-relative glob (at most "
                         f"{MAX_PATTERN} bytes, no leading /)")
    parts: list[str] = []
    segments = pattern.split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            parts.append(".*" if last else "(?:[^/]+/)*")
            continue
        if "**" in segment:
            raise BadRequest("pattern: ** stands alone as a path segment")
        parts.append("[^/]*".join(re.escape(piece) for piece in segment.split("*"))
                     + ("" if last else "/"))
    return re.compile("".join(parts))


def stream_path(value: object, what: str) -> str:
    if not isinstance(value, str) or not value or value.startswith("/") or len(value) > 1024:
        raise BadRequest(f"{what}: a stream-root-relative path (no leading /)")
    if value.split("/", 1)[0] == "__ds":
        raise BadRequest(f"{what}: paths under __ds/ are reserved")
    return value


def stream_paths(value: object, what: str) -> tuple[str, ...]:
    """A list of stream paths, sorted and without repeats (as hashed)."""
    if not isinstance(value, list) or len(value) > MAX_STREAMS_GIVEN:
        raise BadRequest(f"{what} is a list of at most {MAX_STREAMS_GIVEN} stream paths")
    return tuple(sorted({stream_path(item, what) for item in value}))


def subscription_id(text: str) -> str:
    if _ID.fullmatch(text) is None:
        raise BadRequest("a subscription id is 1 to 128 letters, digits, '.', '_', '~' "
                         "or '-'")
    return text


@dataclass(frozen=True, slots=True)
class Definition:
    """What a PUT asks for (§6.2), normalised: two PUTs of the same
    definition have the same ``digest``."""

    kind: str
    pattern: str | None
    streams: tuple[str, ...]
    webhook_url: str | None
    wake_stream: str | None
    lease_ttl_ms: int
    description: str | None

    @property
    def digest(self) -> str:
        """SHA-256 of the normalised definition (§6.2's idempotence)."""
        text = json.dumps([self.kind, self.pattern, list(self.streams), self.webhook_url,
                           self.wake_stream, self.lease_ttl_ms, self.description],
                          separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def definition(body: object) -> Definition:
    """A PUT's JSON body as a ``Definition``; 400 naming the first field
    that is wrong. The webhook URL's safety is the caller's to check."""
    if not isinstance(body, dict):
        raise BadRequest("a subscription is a JSON object")
    known = {"type", "pattern", "streams", "webhook", "wake_stream", "lease_ttl_ms",
             "description"}
    unknown = sorted(set(body) - known)
    if unknown:
        raise BadRequest(f"unknown subscription field {unknown[0][:40]!r}")
    kind = body.get("type")
    if kind not in (WEBHOOK, PULL_WAKE):
        raise BadRequest('type is "webhook" or "pull-wake"')
    pattern = body.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise BadRequest("pattern is a string")
        glob_pattern(pattern)
    streams = stream_paths(body.get("streams", []), "streams")
    if pattern is None and not streams:
        raise BadRequest("a subscription needs a pattern or streams (or both)")
    webhook, wake_stream = body.get("webhook"), body.get("wake_stream")
    url = None
    if kind == WEBHOOK:
        if not isinstance(webhook, dict) or not isinstance(webhook.get("url"), str) \
                or set(webhook) - {"url"}:
            raise BadRequest('a webhook subscription needs webhook: {"url": "https://..."}')
        url = webhook["url"]
        if wake_stream is not None:
            raise BadRequest("wake_stream is for a pull-wake subscription")
    else:
        wake_stream = stream_path(wake_stream, "wake_stream")
        if webhook is not None:
            raise BadRequest("webhook is for a webhook subscription")
    lease = body.get("lease_ttl_ms", LEASE_DEFAULT_MS)
    if not isinstance(lease, int) or isinstance(lease, bool) \
            or not LEASE_MIN_MS <= lease <= LEASE_MAX_MS:
        raise BadRequest(f"lease_ttl_ms is from {LEASE_MIN_MS} to {LEASE_MAX_MS}")
    description = body.get("description")
    if description is not None and (not isinstance(description, str)
                                    or len(description) > 1024):
        raise BadRequest("description is a string of at most 1024 characters")
    return Definition(kind, pattern, streams, url, wake_stream, lease, description)


@dataclass(slots=True)
class Link:
    """One stream of a subscription: how it is linked, its ack and tail."""

    explicit: bool
    glob: bool
    acked: Position
    tail: Position

    @property
    def pending(self) -> bool:
        return (self.tail.appends, self.tail.size) > (self.acked.appends, self.acked.size)

    @property
    def link_type(self) -> str:
        return "explicit" if self.explicit else "glob"  # explicit first (§6.1)


@dataclass(slots=True)
class Wake:
    """The subscription's current wake."""

    wake_id: str
    generation: int
    lease_until: int  # µs; renewed by each valid callback or ack
    holder: str | None = None  # pull-wake: the worker that claimed it
    attempts: int = 0  # webhook: POSTs made
    next_attempt_at: int | None = None  # webhook: when a failed POST is tried again
    snapshot: dict[str, Position] = field(default_factory=dict)  # the tails it carried


@dataclass(slots=True)
class Subscription:
    """One subscription's definition and state."""

    id: str
    spec: Definition
    created_at: int  # µs since the epoch
    matcher: re.Pattern[str] | None
    links: dict[str, Link] = field(default_factory=dict)
    phase: Phase = Phase.IDLE
    generation: int = 0
    wake: Wake | None = None

    @property
    def pending(self) -> bool:
        return any(link.pending for link in self.links.values())

    @property
    def status(self) -> str:
        """§6.3: ``failed`` while a retry is scheduled after a failed POST."""
        return "failed" if self.phase is Phase.RETRYING else "active"

    def matches(self, path: str) -> bool:
        return (self.matcher is not None and self.matcher.fullmatch(path) is not None
                and path != self.spec.wake_stream)  # its own wakes never wake it

    def move(self, event: Event) -> None:
        """Take ``event``; ``FENCED`` where the table has no such move."""
        after = MOVES.get((self.spec.kind, self.phase, event))
        if after is None:
            raise Fenced(f"subscription {self.id}: no current wake takes this "
                         f"({self.phase.value})")
        self.phase = after
        if after is Phase.IDLE:
            self.wake = None

    # -- links ------------------------------------------------------------------

    def heard(self, path: str, tail: Position, created: bool,
              start: Position = START) -> bool:
        """A stream at ``path`` has ``tail`` now; whether that is pending
        work. A stream this subscription's pattern matches but does not yet
        link is new: linked from ``start`` (its first byte; a fork, where it
        forked), so its first data wakes (§6.2)."""
        link = self.links.get(path)
        if link is None:
            if not self.matches(path):
                return False
            link = self.links[path] = Link(False, True, start, start)
        elif created:  # a stream made again at a linked path starts over
            link.acked = start
        link.tail = tail
        return link.pending

    def gone(self, path: str) -> None:
        """The stream at ``path`` was deleted: a glob link goes, an explicit
        one waits for a stream made there again."""
        link = self.links.get(path)
        if link is None:
            return
        if not link.explicit:
            del self.links[path]
        else:
            link.glob = False
            link.acked = link.tail = START

    def add_explicit(self, paths: tuple[str, ...], tails: dict[str, Position]) -> None:
        """Explicit links at the streams' current tails (``tails``: the
        streams that exist); adding a linked one again changes nothing."""
        for path in paths:
            link = self.links.get(path)
            if link is not None:
                link.explicit = True
                continue
            tail = tails.get(path, START)
            self.links[path] = Link(True, self.matches(path), tail, tail)

    def remove_explicit(self, path: str) -> None:
        """Only the explicit link goes; a glob that matches keeps the stream."""
        link = self.links.get(path)
        if link is None or not link.explicit:
            return
        if link.glob or self.matches(path):
            link.explicit, link.glob = False, True
        else:
            del self.links[path]

    def acked(self, acks: object) -> None:
        """Apply ``[{"stream", "offset"}]``: an ack moves forward only, up
        to the tail heard of; a stream not linked is passed over (removed
        since the wake). 400 for a malformed one."""
        if not isinstance(acks, list):
            raise BadRequest('acks is a list of {"stream", "offset"}')
        parsed: list[tuple[Link, Position]] = []
        for ack in acks:
            if not isinstance(ack, dict) or not isinstance(ack.get("stream"), str) \
                    or not isinstance(ack.get("offset"), str):
                raise BadRequest('each ack is {"stream": path, "offset": offset}')
            at = parse_offset(ack["offset"])
            link = self.links.get(ack["stream"])
            if link is None:
                continue
            if (at.appends, at.size) > (link.tail.appends, link.tail.size):
                raise BadRequest(f"ack of {ack['stream'][:200]} past its tail "
                                 f"{link.tail.offset}")
            parsed.append((link, at))
        for link, at in parsed:  # all or nothing
            if (at.appends, at.size) > (link.acked.appends, link.acked.size):
                link.acked = at

    # -- wakes ------------------------------------------------------------------

    def begin_wake(self, wake_id: str, now: int) -> Wake:
        """Pending work on an idle subscription: the next generation's wake."""
        self.move(Event.WAKE)
        self.generation += 1
        self.wake = Wake(wake_id, self.generation, now + self.spec.lease_ttl_ms * 1000)
        self.wake.snapshot = self.pending_tails()
        return self.wake

    def pending_tails(self) -> dict[str, Position]:
        return {path: link.tail for path, link in self.links.items() if link.pending}

    def fenced(self, wake_id: object, generation: object, token_generation: int) -> Wake:
        """The current wake, when a request names it (§7.3); ``FENCED`` else."""
        wake = self.wake
        if wake is None or generation != wake.generation or wake_id != wake.wake_id \
                or token_generation != wake.generation \
                or self.phase in (Phase.WAKE_WRITTEN, Phase.IDLE):
            raise Fenced(f"subscription {self.id}: wake {str(wake_id)[:40]} generation "
                         f"{str(generation)[:20]} is not the current one")
        return wake

    def finish(self, acks: object, done: bool, now: int) -> bool:
        """A valid callback or ack: its acks applied; ``done`` ends the wake,
        else the lease goes on. Whether work is pending after (the next
        wake's coming)."""
        self.acked(acks)
        if done:
            self.move(Event.DONE)
        else:
            self.move(Event.HEARTBEAT)
            assert self.wake is not None
            self.wake.lease_until = now + self.spec.lease_ttl_ms * 1000
        return self.pending

    def answered(self, wake_id: str, done: bool, now: int) -> None:
        """The receiver answered the POST of ``wake_id`` 2xx; ``done``
        (``{"done": true}``): the snapshot it carried is acked (§7.1)."""
        wake = self.wake
        if wake is None or wake.wake_id != wake_id or self.phase is not Phase.DELIVERING:
            return  # a callback ended that wake first
        if done:
            for path, tail in wake.snapshot.items():
                link = self.links.get(path)
                if link is not None and (tail.appends, tail.size) > (
                        link.acked.appends, link.acked.size):
                    link.acked = tail
            self.move(Event.DONE)
        else:
            self.move(Event.ANSWERED)
            wake.lease_until = now + self.spec.lease_ttl_ms * 1000

    def failed(self, wake_id: str, jitter: float, now: int) -> int | None:
        """The POST of ``wake_id`` failed: when to try again (µs), backing
        off from 1 s to 60 s, ``jitter`` (-1..1) times 20 % (§7.1)."""
        wake = self.wake
        if wake is None or wake.wake_id != wake_id or self.phase is not Phase.DELIVERING:
            return None
        self.move(Event.FAILED)
        delay = min(RETRY_FIRST_S * 2 ** max(0, wake.attempts - 1), RETRY_MOST_S)
        wake.next_attempt_at = now + round(delay * (1 + RETRY_JITTER * jitter) * 1e6)
        return wake.next_attempt_at

    def retry(self, now: int) -> Wake:
        """A failed POST's time came: tried again (its tails as they are now)."""
        self.move(Event.RETRY_DUE)
        assert self.wake is not None
        self.wake.next_attempt_at = None
        self.wake.lease_until = now + self.spec.lease_ttl_ms * 1000
        self.wake.snapshot = self.pending_tails()
        return self.wake

    def claim(self, worker: str, now: int) -> Wake:
        """A pull-wake worker claims the written wake: the lease is its."""
        if self.phase is Phase.CLAIMED:
            assert self.wake is not None
            raise AlreadyClaimed(f"subscription {self.id} is claimed by another worker",
                                 self.wake.holder or "", self.wake.generation)
        self.move(Event.CLAIM)
        assert self.wake is not None
        self.wake.holder = worker
        self.wake.lease_until = now + self.spec.lease_ttl_ms * 1000
        self.wake.snapshot = self.pending_tails()
        return self.wake

    def expire(self, now: int) -> bool:
        """Whether the lease ran out at ``now`` (then the wake is dropped)."""
        wake = self.wake
        if wake is None or now < wake.lease_until or self.phase not in (
                Phase.AWAITING, Phase.CLAIMED):
            return False
        self.move(Event.LEASE_EXPIRED)
        return True


class Registry:
    """Every subscription of this node, by id, and the definitions' changes."""

    def __init__(self) -> None:
        self.subscriptions: dict[str, Subscription] = {}

    def __len__(self) -> int:
        return len(self.subscriptions)

    def get(self, sub_id: str) -> Subscription:
        sub = self.subscriptions.get(sub_id)
        if sub is None:
            raise NotFound(f"no subscription {sub_id[:128]}")
        return sub

    def put(self, sub_id: str, spec: Definition, tails: dict[str, Position],
            now: int) -> tuple[Subscription, bool]:
        """The subscription ``sub_id`` of ``spec`` and whether this made it;
        409 ``SUBSCRIPTION_CONFLICT`` for another definition at that id.
        ``tails``: every stream held now, by path (the backfill, §6.2)."""
        known = self.subscriptions.get(sub_id)
        if known is not None:
            if known.spec.digest != spec.digest:
                raise SubscriptionConflict(f"subscription {sub_id[:128]} exists with "
                                           "another definition")
            return known, False
        if len(self.subscriptions) >= MAX_SUBSCRIPTIONS:
            raise StreamsFull(f"this node holds {MAX_SUBSCRIPTIONS} subscriptions, its most: "
                              "delete some")
        matcher = None if spec.pattern is None else glob_pattern(spec.pattern)
        sub = Subscription(sub_id, spec, now, matcher)
        for path, tail in tails.items():
            if sub.matches(path):
                sub.links[path] = Link(False, True, tail, tail)
        sub.add_explicit(spec.streams, tails)
        self.subscriptions[sub_id] = sub
        return sub, True

    def delete(self, sub_id: str) -> Subscription:
        sub = self.get(sub_id)
        del self.subscriptions[sub_id]
        return sub

    def heard(self, path: str, tail: Position, created: bool,
              start: Position = START) -> list[Subscription]:
        """A stream changed: the subscriptions it gave pending work."""
        return [sub for sub in self.subscriptions.values()
                if sub.heard(path, tail, created, start)]

    def gone(self, path: str) -> None:
        for sub in self.subscriptions.values():
            sub.gone(path)


def link_view(path: str, link: Link, with_tail: bool) -> dict[str, object]:
    view: dict[str, object] = {"path": path, "link_type": link.link_type,
                               "acked_offset": link.acked.offset}
    if with_tail:
        view["tail_offset"] = link.tail.offset
        view["has_pending"] = link.pending
    return view


def webhook_url_problem(url: str) -> str | None:
    """Why a webhook may not POST to ``url`` (§6.2, §12.8), or None:
    ``https://`` to any host but a private, loopback, link-local or other
    non-global address; ``http://`` only to ``localhost`` or ``127.0.0.x``
    (the protocol's development exception, which ``https://`` has too). A
    name is not resolved here (docs/api.md says so)."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "not a URL"
    del port  # (read to check it is a number)
    if parts.scheme not in ("http", "https") or not host:
        return "a webhook URL is https://HOST/..."
    if parts.username is not None or parts.password is not None:
        return "a webhook URL carries no user name or password"
    local = host == "localhost" or _is_127_0_0(host)
    if local:
        return None
    if parts.scheme == "http":
        return "a webhook URL is https:// (http:// only to localhost or 127.0.0.x)"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None if "." in host and not host.endswith((".localhost", ".local", ".internal")) \
            else "a webhook host is a public name or address"
    if not address.is_global or address.is_multicast:
        return f"{host} is not a public address"
    return None


def _is_127_0_0(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return isinstance(address, ipaddress.IPv4Address) and host.startswith("127.0.0.")


# -- as kept (``--data-dir``): what a restart reads back ----------------------------
# A link's tail is not kept: it is the stream's, read again from the streams at
# start; so a stream's append changes nothing kept. A glob link is kept when the
# subscription is made (its backfill) and when an ack moves it; a matching stream
# found unlinked at start was made since, and is linked from its start. A wake
# whose POST was under way is tried again at once.

def state_of(sub: Subscription) -> dict[str, object]:
    spec, wake = sub.spec, sub.wake
    return {
        "spec": [spec.kind, spec.pattern, list(spec.streams), spec.webhook_url,
                 spec.wake_stream, spec.lease_ttl_ms, spec.description],
        "created_at": sub.created_at, "phase": sub.phase.value, "generation": sub.generation,
        "links": {path: [link.explicit, link.glob, link.acked.appends, link.acked.size]
                  for path, link in sub.links.items()},
        "wake": None if wake is None else [
            wake.wake_id, wake.generation, wake.lease_until, wake.holder, wake.attempts,
            wake.next_attempt_at,
            {path: [at.appends, at.size] for path, at in wake.snapshot.items()}]}


def subscription_of(sub_id: str, state: dict[str, Any], tails: dict[str, Position],
                    now: int, complete: bool = True) -> Subscription:
    """A subscription as ``state_of`` kept it; ``tails``: the streams' now
    (``complete``: every stream's, so a linked path missing was deleted)."""
    kind, pattern, streams, url, wake_stream, lease, description = state["spec"]
    spec = Definition(kind, pattern, tuple(streams), url, wake_stream, lease, description)
    sub = Subscription(sub_id, spec, int(state["created_at"]),
                       None if pattern is None else glob_pattern(pattern))
    sub.phase = Phase(state["phase"])
    sub.generation = int(state["generation"])
    for path, (explicit, glob, appends, size) in state["links"].items():
        acked = Position(int(appends), int(size))
        tail = tails.get(path, acked)
        if (tail.appends, tail.size) < (acked.appends, acked.size):
            tail = acked
        sub.links[path] = Link(bool(explicit), bool(glob), acked, tail)
    for path in [path for path in sub.links if complete and path not in tails]:  # deleted
        sub.gone(path)
    for path, tail in tails.items():  # made after the state was kept: linked from the start
        if path not in sub.links and sub.matches(path):
            sub.links[path] = Link(False, True, START, tail)
    kept = state["wake"]
    if kept is not None:
        wake_id, generation, lease_until, holder, attempts, next_at, snapshot = kept
        sub.wake = Wake(wake_id, generation, lease_until, holder, attempts, next_at,
                        {path: Position(a, b) for path, (a, b) in snapshot.items()})
        if sub.phase is Phase.DELIVERING:  # its answer was lost with the process
            sub.phase = Phase.RETRYING
            sub.wake.next_attempt_at = now
    return sub
