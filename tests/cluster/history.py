"""One history checker for every fault: what clients were promised against
what each subscriber got.

Publishers (``Publisher``) record every publish attempt: a 201 is a promise
(the message is acknowledged); any other answer, or none, leaves the outcome
open (202 "held by this node only", 503, 504, a connection lost). Each channel
has one publisher that waits for every answer before the next publish, so a
channel's order is its publisher's sequence number ``seq``, carried in the
message's data with the channel name.

Subscribers (``Subscriber``) follow their cursor as a real client does, from
``since=now`` taken before anything is published: each poll goes to one node
(the next one for a hopping client; a sticky client moves only when its node
fails it), and every message and every ``"gap": true`` is logged in order.

``check`` then holds every subscriber to the contract (API.md, "No loss, no
duplicates", "Gaps are said, never silent"): each acknowledged message of its
channels received exactly once, acknowledged messages of one origin (the node
that accepted them) in their channel's order,
and a missing one only where a gap was reported between its neighbours --
and, with ``allow_gaps`` False (a majority of members survived), not even
then. Messages whose publish had no 201 may arrive or not, but never twice.
The figures (``Costs``) say what the fault cost: messages delayed, the
largest delivery lag, gaps, and the time from the heal until every
subscriber held every message acknowledged before it.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from deploy.processes import NETWORK_ERRORS, wait_until
from tests.cluster.clients import answered, comes_within

DELAYED_S = 1.0  # a message delivered this long after its 201 counts as delayed


def call(method: str, url: str, body: object = None,
         timeout: float = 10.0) -> tuple[int, dict[str, Any]]:
    """One request on a fresh connection: (status, JSON body)."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        path = u.path + ("?" + u.query if u.query else "")
        conn.request(method, path, body=data, headers={
            "Connection": "close", "Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        return r.status, (json.loads(raw) if raw else {})
    finally:
        conn.close()


@dataclass
class Attempt:
    """One publish: ``status`` None when no answer came."""
    channel: str
    seq: int
    url: str
    sent: float
    answered: float
    status: int | None
    id: str | None


class History:
    """Every publish attempt, shared by the publishers (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.attempts: dict[tuple[str, int], Attempt] = {}

    def record(self, a: Attempt) -> None:
        with self.lock:
            self.attempts[(a.channel, a.seq)] = a

    def count(self) -> int:
        with self.lock:
            return len(self.attempts)

    def acked(self) -> dict[tuple[str, int], Attempt]:
        with self.lock:
            return {k: a for k, a in self.attempts.items() if a.status == 201}


class Publisher(threading.Thread):
    """Publishes ``count`` messages, round-robin over ``channels`` (its own) and
    ``urls``, one at a time; ``pad`` bytes of filler make each message larger."""

    def __init__(self, name: str, history: History, urls: Sequence[str],
                 channels: Sequence[str], count: int, pace: float = 0.0,
                 pad: int = 0, pause_after: int = -1,
                 resume: threading.Event | None = None) -> None:
        """``pause_after``: after that many, wait for ``resume`` (the fault in
        place, so that what follows is published while it holds)."""
        super().__init__(name=name, daemon=True)
        self.history, self.urls, self.channels = history, list(urls), list(channels)
        self.count, self.pace, self.pad = count, pace, "x" * pad
        self.pause_after, self.resume = pause_after, resume
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            n = 0
            while n < self.count:  # (re-read: a run cut short sets it to 0)
                if n == self.pause_after and self.resume is not None:
                    self.resume.wait(120)
                ch = self.channels[n % len(self.channels)]
                seq = n // len(self.channels)
                url = self.urls[n % len(self.urls)]
                t0 = time.monotonic()
                try:
                    status, body = call("POST", url + "/publish", {
                        "channels": [ch], "data": {"ch": ch, "seq": seq, "pad": self.pad}})
                except NETWORK_ERRORS:
                    status, body = None, {}
                self.history.record(Attempt(ch, seq, url, t0, time.monotonic(), status,
                                            body.get("id") if status in (201, 202) else None))
                n += 1
                if status is None or status >= 500:
                    time.sleep(0.05)  # as a client backs off before its next publish
                elif self.pace:
                    time.sleep(self.pace)
        except BaseException as e:  # reported, the test fails on it
            self.errors.append(f"{self.name} crashed: {e!r}")


@dataclass
class Event:
    at: float
    url: str
    kind: str  # "msg" or "gap"
    channel: str = ""
    seq: int = -1
    id: str = ""


class Subscriber(threading.Thread):
    """A long-polling client following its cursor over ``urls``."""

    def __init__(self, name: str, urls: Sequence[str], channels: Sequence[str],
                 hop: bool, timeout: float = 1.0, limit: int = 50) -> None:
        super().__init__(name=name, daemon=True)
        self.urls, self.channels, self.hop = list(urls), list(channels), hop
        self.poll_timeout, self.limit = timeout, limit
        self.log: list[Event] = []
        self.failures: list[str] = []
        self.errors: list[str] = []
        self.have: set[tuple[str, int]] = set()
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.next = 0
        self.cursor = self._now()

    def _now(self) -> str:
        """The cursor of ``since=now``, from the first node that answers."""
        for url in self.urls:
            with_cursor = self.poll(url, "now", 0)
            if with_cursor is not None:
                return with_cursor
        raise AssertionError(f"{self.name}: no node gave a cursor: {self.failures}")

    def poll(self, url: str, since: str, timeout: float) -> str | None:
        """One poll; logs what it brought and returns the new cursor (None: failed)."""
        q = urllib.parse.urlencode({"channels": ",".join(self.channels), "since": since,
                                    "timeout": str(timeout), "limit": str(self.limit)})
        body = answered(self.failures, url,
                        lambda: call("GET", f"{url}/subscribe?{q}", timeout=timeout + 10))
        if body is None:
            return None
        now = time.monotonic()
        with self.lock:
            if body.get("gap"):
                self.log.append(Event(now, url, "gap"))
            for m in body["messages"]:
                d = m["data"]
                self.log.append(Event(now, url, "msg", d["ch"], d["seq"], m["id"]))
                self.have.add((d["ch"], d["seq"]))
        return str(body["cursor"])

    def holds(self, keys: set[tuple[str, int]]) -> bool:
        with self.lock:
            return keys <= self.have

    def step(self, timeout: float) -> int | None:
        """One poll with the cursor; the number of messages, None on failure."""
        url = self.urls[self.next % len(self.urls)]
        before = len(self.log)
        cursor = self.poll(url, self.cursor, timeout)
        if cursor is None or self.hop:
            self.next += 1
        if cursor is None:
            return None
        self.cursor = cursor
        return len(self.log) - before

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                if self.step(self.poll_timeout) is None:
                    time.sleep(0.05)  # the next node, after a short back-off
        except BaseException as e:  # reported, the test fails on it
            self.errors.append(f"{self.name} crashed: {e!r}")

    def finish(self) -> None:
        """Stop, then pull (timeout 0) from every node until none has more."""
        self.stop_event.set()
        self.join(30)
        assert not self.is_alive(), f"{self.name} did not stop"
        for url in self.urls:
            for _ in range(1000):
                before = len(self.log)
                cursor = self.poll(url, self.cursor, 0)
                if cursor is None:
                    break
                self.cursor = cursor
                if len(self.log) == before:
                    break


Key = tuple[str, int]  # (channel, seq): one publish


def keys_for(acked: dict[Key, Attempt], channels: Sequence[str]) -> set[Key]:
    mine = set(channels)
    return {k for k in acked if k[0] in mine}


def wait_delivered(history: History, subscribers: Sequence[Subscriber], timeout: float) -> bool:
    """Bounded wait until every subscriber holds every acknowledged message."""
    acked = history.acked()
    return comes_within(
        lambda: all(s.holds(keys_for(acked, s.channels)) for s in subscribers), timeout)


@dataclass
class Costs:
    """What a fault cost, from the histories (seconds; counts over subscribers)."""
    published: int = 0
    acked: int = 0
    unacked: int = 0  # attempts without a 201
    answers: dict[str, int] = field(default_factory=dict)  # their answers ("none": no answer)
    unacked_delivered: int = 0  # deliveries of such messages (allowed, once)
    deliveries: int = 0  # acknowledged messages received, over all subscribers
    delayed: int = 0  # of those, received more than DELAYED_S after their 201
    max_lag_s: float = 0.0  # the largest (receipt - 201) of all
    max_lag_during_cut_s: float = 0.0  # the same, for messages acknowledged during the fault
    gaps: int = 0
    cut_s: float = 0.0  # how long the fault lasted
    heal_s: float = 0.0  # heal until every subscriber held all acknowledged before it
    poll_failures: int = 0
    fault: dict[str, int] = field(default_factory=dict)  # what the fault says it did
    problems: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, object]:
        d = dict(self.__dict__)
        d.pop("problems")
        d.update(d.pop("fault"))
        for k in ("max_lag_s", "max_lag_during_cut_s", "cut_s", "heal_s"):
            d[k] = round(float(d[k]), 3)
        return d


class Seen(Protocol):
    """What ``check`` reads of a subscriber."""
    name: str
    channels: list[str]
    log: list[Event]
    failures: list[str]
    errors: list[str]


def check(history: History, subscribers: Sequence[Seen], allow_gaps: bool,
          cut_at: float = 0.0, healed_at: float = 0.0) -> Costs:
    """Hold every subscriber to the contract; the problems found, and the costs."""
    acked = history.acked()
    costs = Costs(published=history.count(), acked=len(acked), cut_s=healed_at - cut_at)
    costs.unacked = costs.published - costs.acked
    with history.lock:
        for a in history.attempts.values():
            if a.status != 201:
                answer = str(a.status or "none")
                costs.answers[answer] = costs.answers.get(answer, 0) + 1
    problems = costs.problems
    for s in subscribers:
        costs.poll_failures += len(s.failures)
        problems += s.errors
        gaps_at = [i for i, e in enumerate(s.log) if e.kind == "gap"]
        costs.gaps += len(gaps_at)
        seen: dict[tuple[str, int], int] = {}  # key -> position in the log
        last_acked: dict[tuple[str, str], int] = {}  # (channel, origin) -> last seq
        for pos, e in enumerate(s.log):
            if e.kind != "msg":
                continue
            key = (e.channel, e.seq)
            if key in seen:
                problems.append(f"{s.name}: {key} ({e.id}) received twice (from {e.url})")
                continue
            seen[key] = pos
            if key not in acked:
                costs.unacked_delivered += 1
                continue
            a = acked[key]
            if a.id != e.id:
                problems.append(f"{s.name}: {key} arrived as {e.id}, acknowledged as {a.id}")
            # The order promised is the origin's (API.md: a node's messages in
            # the order it accepted them); across origins the mesh delivers
            # what the serving node holds (docs/faults.md, "Order").
            order = (e.channel, e.id.rsplit("-", 1)[0])
            if last_acked.get(order, -1) > e.seq:
                problems.append(f"{s.name}: {key} arrived after seq {last_acked[order]} of "
                                f"its channel from the same origin (from {e.url})")
            last_acked[order] = max(last_acked.get(order, -1), e.seq)
            lag = max(0.0, e.at - a.answered)
            costs.deliveries += 1
            costs.delayed += lag > DELAYED_S
            costs.max_lag_s = max(costs.max_lag_s, lag)
            if cut_at <= a.answered <= healed_at:
                costs.max_lag_during_cut_s = max(costs.max_lag_during_cut_s, lag)
            if a.answered < healed_at:
                costs.heal_s = max(costs.heal_s, e.at - healed_at)
        missing = sorted(keys_for(acked, s.channels) - set(seen))
        for key in missing:
            ch, seq = key
            before = max((p for (c, q), p in seen.items() if c == ch and q < seq), default=-1)
            after = min((p for (c, q), p in seen.items() if c == ch and q > seq),
                        default=len(s.log))
            said = any(before < g < after for g in gaps_at)
            if not (said and allow_gaps):
                a = acked[key]
                problems.append(f"{s.name}: acknowledged {key} ({a.id}, 201 from {a.url}) "
                                + ("lost behind a gap while a majority survived" if said
                                   else "never received and no gap said"))
    return costs


@dataclass
class Load:
    """How much to publish around a fault; every figure bounds the run."""
    publishers: int = 2
    channels_per_publisher: int = 2
    count: int = 120  # messages per publisher
    pace: float = 0.01  # seconds between a publisher's answer and its next publish
    pad: int = 0  # filler bytes per message
    subscribers: int = 4
    before: int = 40  # publish attempts (all publishers) before the fault
    during: int = 80  # attempts while it lasts...
    min_fault_s: float = 0.0  # ...and at least this long
    settle_s: float = 60.0  # longest wait for delivery once the publishers are done


def under_fault(fault: Callable[[], AbstractContextManager[object]], pub_urls: Sequence[str],
                sub_urls: Sequence[str], load: Load, allow_gaps: bool = False,
                tag: str = "f") -> Costs:
    """Subscribers, then publishers; the fault made after ``load.before``
    attempts and healed after ``load.during`` more (and ``min_fault_s``); the
    publishers run to the end, the subscribers until they hold every
    acknowledged message (or ``settle_s``); then ``check``. Half the
    subscribers hop to the next node at every poll, the others stay on one
    (each starting on a different node) until it fails them."""
    history = History()
    channels = [[f"{tag}-{p}-{c}" for c in range(load.channels_per_publisher)]
                for p in range(load.publishers)]
    every = [ch for mine in channels for ch in mine]
    subs = []
    for k in range(load.subscribers):
        urls = [*sub_urls[k % len(sub_urls):], *sub_urls[:k % len(sub_urls)]]
        mine = every if k == 0 else sorted({every[k % len(every)],
                                            every[(k * 3 + 1) % len(every)]})
        subs.append(Subscriber(f"sub{k}", urls, mine, hop=k % 2 == 1))
    # each publisher waits after its share of ``before`` until the fault is
    # made: on a busy machine making it can outlast the whole load otherwise
    resume = threading.Event()
    share = -(-load.before // load.publishers)
    pubs = [Publisher(f"pub{p}", history, [*pub_urls[p:], *pub_urls[:p]], channels[p],
                      load.count, load.pace, load.pad, share, resume)
            for p in range(load.publishers)]
    cut_at = healed_at = 0.0
    held: object = None
    try:
        for s in subs:
            s.start()
        for p in pubs:
            p.start()
        total = load.publishers * load.count
        wait_until(lambda: history.count() >= min(load.before, total), 120,
                   msg="load before the fault")
        with fault() as held:
            cut_at = time.monotonic()
            resume.set()
            wait_until(lambda: history.count() >= min(load.before + load.during, total)
                       and time.monotonic() - cut_at >= load.min_fault_s,
                       120 + load.min_fault_s, msg="load during the fault")
            healed_at = time.monotonic()
        for p in pubs:
            p.join(300)
            assert not p.is_alive(), f"{p.name} did not finish"
        wait_delivered(history, subs, load.settle_s)
    finally:
        resume.set()
        for p in pubs:
            p.count = 0  # (a publisher still running stops after its request)
        for s in subs:
            s.stop_event.set()
    for s in subs:
        s.finish()
    costs = check(history, subs, allow_gaps, cut_at, healed_at)
    costs.fault = dict(held) if isinstance(held, dict) else {}
    for p in pubs:
        costs.problems += p.errors
    return costs
