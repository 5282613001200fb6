"""Presence at the HTTP front: who each poll and stream is, ``GET /presence``,
and the membership changes a ``presence=1`` subscribe follows.

The handlers call in where a subscribe starts and ends (``poll``, ``stream``);
this module keys it (a ``client=`` id, else the user's token, else nobody we
could recognise again), feeds this node's :class:`~pushup.core.presence.Presence`,
and merges the result with the other nodes' (the engine's replicator calls
``node_changes`` / ``node_state`` / ``node_gone``) in one
:class:`~pushup.core.roster.Roster`. Each of the roster's events goes to the
listeners (the webhook sender) and wakes the ``presence=1`` polls and streams
of its channel, on a later turn (those are :mod:`pushup.http.presence_followers`'s).
A ``presence=1`` poll keeps its place in
the roster's events in its cursor, as an origin of its own per node
(``_presence-<hash>.p``), which the store never sees. Nothing here reads a
socket; time is the service's clock.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable

import jwt
from twisted.logger import Logger

from pushup.core import errors
from pushup.core.clock import Alarm, DelayedCall
from pushup.core.cursor import Cursor
from pushup.core.hub import Waiter
from pushup.core.model import Now, Query, Result, check_channel_list, dumps
from pushup.core.presence import Change, Join, Leave, Presence
from pushup.core.roster import Event, Roster
from pushup.core.service import Delivery, Service
from pushup.http.exchange import Response
from pushup.http.params import Args
from pushup.http.presence_followers import (
    ANONYMOUS,
    Counted,
    HeldAnswer,
    Poll,
    Stream,
    Who,
    event_json,
    member_json,
)
from pushup.http.render import poll_body
from pushup.http.sse import StreamClient

log = Logger()
MAX_INFO_BYTES = 1024  # a token's info claim, as JSON
MAX_USER_CHARS = 200  # a user (a token's sub, or user=)
_CLIENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_KEPT_CLAIMS = 4096  # tokens whose (sub, info) are remembered
_KEPT_WHOS = 4096  # identities remembered (each re-poll of a member is one lookup)
POSITION_PREFIX = "_presence-"  # a cursor's origin that holds a presence position


class PresenceDesk:
    """This node's presence: the local subscriptions, the cluster's roster,
    the followers. ``window`` and ``cap`` in seconds and members."""

    def __init__(self, service: Service, window: float, cap: int, tokens: bool,
                 settle: float = 0.0) -> None:
        """``settle``: seconds from now before this node may say the cluster's
        events (a node that just started has not yet heard the others: what
        it would say first is what they knew already)."""
        self.service = service
        # this node in the roster: its origin (node id and boot), so a node that
        # restarts is another entry, and the old one goes as a dead node's does
        self.node = service.store.origin_name
        self._settled_at = service.now() + round(settle * 1e6)
        self.cap = cap
        self.tokens = tokens  # users come from subscriber tokens (else from user=)
        self.local = Presence(round(window * 1e6))
        self.roster = Roster()
        self.roster.apply(self.node, ())
        self._origin = POSITION_PREFIX + hashlib.blake2b(
            service.store.origin_name.encode(), digest_size=8).hexdigest() + ".p"
        self.listeners: list[Callable[[list[Event]], None]] = []  # the cluster's events
        self.local_listeners: list[Callable[[list[Change]], None]] = []  # this node's
        self.polls: dict[str, set[Poll]] = {}  # presence=1 polls held, by channel
        self.streams: dict[str, set[Stream]] = {}  # presence=1 streams, by channel
        self._woken: set[str] = set()  # channels with events for followers, this turn
        self._wake: DelayedCall | None = None
        self._claims: OrderedDict[str, tuple[str | None, str | None]] = OrderedDict()
        # who a subscribe is, by what names it (client, user=, token, channels): a
        # member's re-polls are one lookup, not a check and a key built each time;
        # emptied when full (a cache, not a record: a miss only costs the build)
        self._whos: dict[tuple[str | None, str | None, str | None, tuple[str, ...]], Who] = {}
        self._counting: DelayedCall | None = None  # the counts that moved, said next turn
        self._alarm = Alarm(service.clock, self._expire)

    # -- who ---------------------------------------------------------------

    def parse(self, marks: tuple[str | None, str | None, str | None], token: str | None,
              channels: tuple[str, ...]) -> tuple[Who, bool]:
        """Who a subscribe is, and whether it follows presence (``presence=1``),
        from its ``presence``, ``client`` and ``user`` parameters (parsed, and
        cached, with the rest of its query by the handler); 400 for a bad one."""
        follow, client, user = marks
        if follow is None and client is None and (user if not self.tokens else token) is None:
            return ANONYMOUS, False  # (most polls, where nobody asks for presence: no work)
        if follow not in (None, "0", "1"):
            raise errors.BadRequest("presence is 0 or 1")
        named = (client, user, token, channels)
        who = self._whos.get(named)
        if who is None:
            who = self.who(client, user, token, channels)  # (400 for a bad one: not kept)
            if len(self._whos) >= _KEPT_WHOS:
                self._whos.clear()
            self._whos[named] = who
        return who, follow == "1"

    def who(self, client: str | None, given: str | None, token: str | None,
            channels: tuple[str, ...]) -> Who:
        """The identity of a subscribe (its token already verified, if any):
        the token's user on a node with tokens, else ``user=`` (``given``)."""
        user, info = self._claims_of(token) if self.tokens else (given, None)
        if user is not None and not 0 < len(user) <= MAX_USER_CHARS:
            raise errors.BadRequest(f"a user is 1 to {MAX_USER_CHARS} characters")
        if client is not None and not _CLIENT_ID.fullmatch(client):
            raise errors.BadRequest("client is 1 to 64 letters, digits, _ or -")
        base = f"c:{client}" if client else (f"u:{user}:{token}" if user else None)
        key = None if base is None else base + "\n" + ",".join(channels)
        return Who(key, user, info)

    def _claims_of(self, token: str | None) -> tuple[str | None, str | None]:
        if not token:
            return None, None
        kept = self._claims.get(token)
        if kept is not None:
            return kept
        try:  # verified already by the Verifier (pushup.http.tokens)
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.InvalidTokenError:
            return None, None
        sub = claims.get("sub")
        user = sub if isinstance(sub, str) and sub else None
        raw = claims.get("info")
        info = None
        if raw is not None:
            if not isinstance(raw, dict):
                raise errors.BadRequest("the token's info claim must be an object")
            info = json.dumps(raw, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
            if len(info.encode()) > MAX_INFO_BYTES:
                raise errors.BadRequest(f"the token's info claim is over {MAX_INFO_BYTES} bytes")
        kept = self._claims[token] = (user, info)
        if len(self._claims) > _KEPT_CLAIMS:
            self._claims.popitem(last=False)
        return kept

    # -- the hooks: a subscription starts and ends -------------------------

    def hold(self, who: Who, channels: tuple[str, ...]) -> None:
        """A poll or stream starts (``release`` it with the same ``who``)."""
        key = who.key
        if key is None:
            self.local.hold_anonymous(channels)
            if self._counting is None:
                self._counting = self.service.clock.callLater(0, self._say_counts)
            return
        changes = self.local.hold(key, who.user, who.info, channels)
        if changes is not None:  # (None: a re-poll of a known key moved nothing)
            self._local(changes)

    def release(self, who: Who, channels: tuple[str, ...]) -> None:
        """A poll or stream ended: an anonymous one leaves the count at once,
        a keyed one lingers for the window (the alarm is set when the first
        key lingers, and by each expiry for the next: not once per poll)."""
        key = who.key
        if key is None:
            self.local.release_anonymous(channels)
            if self._counting is None:
                self._counting = self.service.clock.callLater(0, self._say_counts)
            return
        now = self.service.now()
        if self.local.release(key, now):
            self._alarm.set(self.local.next_deadline(), now)

    def _expire(self, deadline: int) -> None:
        now = self.service.now()
        self._local(self.local.expire(now))
        self._alarm.set(self.local.next_deadline(), now)

    def _local(self, changes: list[Join | Leave]) -> None:
        """Membership changes are said at once, after the counts that moved
        (in that order: a channel is occupied before its first member);
        counts alone on the next turn, once for every poll of this one."""
        if changes:
            self._say(self.local.take_counts() + changes)
        elif self._counting is None and self.local.counts_moved:
            self._counting = self.service.clock.callLater(0, self._say_counts)

    def _say_counts(self) -> None:
        self._counting = None
        counts = self.local.take_counts()
        if counts:
            self._say(list(counts))

    def _say(self, changes: list[Change]) -> None:
        for listener in self.local_listeners:
            listener(changes)
        self._events(self.roster.apply(self.node, changes))

    # -- what the engine's replicator calls --------------------------------

    def node_changes(self, node: str, changes: list[Change]) -> None:
        self._events(self.roster.apply(node, changes))

    def node_state(self, node: str, state: dict[str, tuple[int, dict[str, str | None]]],
                   ) -> None:
        self._events(self.roster.replace(node, state))

    def node_gone(self, node: str) -> None:
        if node in self.roster.nodes:
            log.info("presence: node {node}'s subscribers leave (not heard from)", node=node)
            self._events(self.roster.forget(node))

    def _events(self, events: list[Event]) -> None:
        if not events:
            return
        for listener in self.listeners:
            listener(events)
        for event in events:
            if event.user is not None:
                self._woken.add(event.channel)
        if self._woken and self._wake is None:
            self._wake = self.service.clock.callLater(0, self._wake_followers)

    # -- followers ----------------------------------------------------------

    def _wake_followers(self) -> None:
        self._wake = None
        channels, self._woken = self._woken, set()
        polls: set[Poll] = set()
        streams: set[Stream] = set()
        for name in channels:
            polls.update(self.polls.get(name, ()))
            streams.update(self.streams.get(name, ()))
        for poll in polls:
            poll.wake()
        for stream in streams:
            stream.send_since()

    def position(self, cursor: Cursor | int | Now) -> tuple[Cursor | int | Now, int | None,
                                                          dict[str, int]]:
        """A ``presence=1`` subscribe's ``since``, without the presence
        positions; this node's position (None: none) and every node's."""
        if not isinstance(cursor, Cursor):
            return cursor, None, {}
        ours = {o: s for o, s in cursor.positions if o.startswith(POSITION_PREFIX)}
        if not ours:
            return cursor, None, {}
        rest = Cursor(tuple(p for p in cursor.positions if p[0] not in ours))
        return rest, ours.get(self._origin), ours

    def render(self, delivery: Delivery, events: list[Event], held: dict[str, int]) -> bytes:
        """A long poll's body with its ``presence`` list, the cursor carrying
        this node's position in the roster (and the other nodes' as they were)."""
        result = delivery.result
        cursor = result.cursor.advanced([*held.items(), (self._origin, self.roster.seq)])
        body = poll_body(Delivery(delivery.query, Result(result.messages, cursor, result.gap),
                                  delivery.closed))
        return body[:-1] + b',"presence":[' + b",".join(map(event_json, events)) + b"]}"

    def poll(self, query: Query, timeout: float, who: Who, client: HeldAnswer,
             follow: bool) -> tuple[Delivery | Waiter | bytes, Callable[[], None]]:
        """A long poll starts: the service's outcome (or, following, the
        whole body of an answer now) and what to call if the client goes."""
        self.hold(who, query.channels)
        if not follow:  # the common case, kept short: counted while held
            counted = Counted(self, client, who, query.channels)
            outcome = self.service.subscribe(query, timeout, counted)
            if isinstance(outcome, Delivery):
                counted.end()
            else:
                counted.waiter = outcome
            return outcome, counted.gone
        poll = Poll(self, client, who, query, timeout, follow)
        return poll.start(), poll.gone

    def stream(self, who: Who, channels: tuple[str, ...], client: StreamClient,
               follow: bool) -> Stream:
        """An event stream starts: the client to give it (it tells us when
        the stream ends; with ``follow``, the stream gets ``event: presence``)."""
        self.hold(who, channels)
        return Stream(self, client, who, channels, follow)

    # -- GET /presence --------------------------------------------------------

    def answer(self, channels: Iterable[str], members: bool) -> Response:
        parts = []
        for name in channels:
            seen = self.roster.occupancy(name, self.cap)
            body = b'{"occupancy":%d' % seen.subscribers
            if members:
                body += b',"members":[' + b",".join(
                    member_json(user, info) for user, info in seen.members) + b"]"
                body += b',"members_truncated":' + (b"true" if seen.truncated else b"false")
            parts.append(dumps(name) + b":" + body + b"}")
        return Response(200, b'{"channels":{' + b",".join(parts) + b"}}")

    def leads(self) -> bool:
        """Whether this node is the one that says the cluster's events: the
        lowest node id among the nodes the roster holds (those alive), once
        settled."""
        first = min(self.roster.nodes).rpartition(".")[0]  # (an origin is <node id>.<boot>)
        return first == self.node.rpartition(".")[0] and self.service.now() >= self._settled_at

    def figures(self) -> dict[str, int]:
        return {"presence_subscriptions": len(self.local),
                "presence_channels": self.roster.channels,
                "presence_nodes": len(self.roster.nodes),
                "presence_sender": int(self.leads())}


def presence_query(args: Args, max_channels: int) -> tuple[tuple[str, ...], bool]:
    """``GET /presence`` parameters: the channels, and whether to list members."""
    names = args.get("channels")
    if names is None:
        raise errors.BadRequest("channels is required: ?channels=a,b")
    members = args.get("members")
    if members not in (None, "0", "1"):
        raise errors.BadRequest("members is 0 or 1")
    return check_channel_list(names.split(","), max_channels), members == "1"
