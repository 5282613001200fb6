"""The blocking client: ``Client`` publishes and manages channels,
``Subscription`` long-polls. The only module of ``pushup.client`` that does I/O.

Every request goes through ``Client._send``, the one place that decides what
is retried (503, 504, other 5xx, timeouts, dropped connections: on the next
node, after a jittered backoff and at least ``Retry-After``) and what is
raised at once (every 4xx, as ``APIError``). A publish carries one
``Idempotency-Key`` for all its attempts, so a retry never stores it twice.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from pushup.client.reading import Following, Reading
from pushup.client.retry import Attempts, Backoff, Rotation
from pushup.client.values import ChannelInfo, Event, Published, Receipt

NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)  # nothing reached a node


def error_of(response: httpx.Response) -> tuple[str, str]:
    """The (code, message) of an error answer; HAProxy's or a proxy's page
    without PushUp's JSON body gives ("", its first characters)."""
    try:
        error = response.json()["error"]
        return str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        return "", response.text[:200]


def encode(body: Any, headers: dict[str, str] | None) -> tuple[bytes | None, dict[str, str]]:
    """A request's JSON body and its headers."""
    all_headers = dict(headers or {})
    if body is None:
        return None, all_headers
    all_headers["Content-Type"] = "application/json"
    return json.dumps(body).encode(), all_headers


def quote_name(name: str) -> str:
    return quote(name, safe="")


class Client:
    """A PushUp cluster seen from a web app or a worker.

    ``urls`` is one base URL (a load balancer) or several (the nodes); each
    retry goes to the next one. ``publish_token`` is sent as ``Authorization:
    Bearer`` on publishes and channel operations. ``timeout`` bounds each
    request (a long poll gets its own hold on top). ``retries`` is how many
    times a request is tried again before ``Unavailable`` is raised.
    ``http_client`` replaces the ``httpx.Client`` (its own timeouts, hooks,
    transport); the caller then closes it. Thread-safe as httpx is: several
    threads may publish and subscribe through one client.
    """

    def __init__(self, urls: str | Sequence[str], *, publish_token: str | None = None,
                 timeout: float = 10.0, retries: int = 5, backoff: Backoff | None = None,
                 http_client: httpx.Client | None = None) -> None:
        self._rng = random.Random()
        self._urls = [urls] if isinstance(urls, str) else list(urls)
        self._nodes = Rotation(self._urls, self._rng)
        self.publish_token = publish_token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff or Backoff(rng=self._rng)
        self._http = http_client or httpx.Client(timeout=timeout)
        self._owns_http = http_client is None

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- publishing ------------------------------------------------------------

    def publish(self, channels: str | Sequence[str], data: Any, *,
                idempotency_key: str | None = None) -> Published:
        """Publish ``data`` (any JSON value) to ``channels``.

        Returns once a node stored it: ``acknowledged`` says 201 (held as
        the node promises) or 202 (this node only, for now). Raises
        ``APIError`` on a 4xx and ``Unavailable`` when the retries ran out.
        Every attempt carries ``idempotency_key`` (a new UUID if not given),
        so the message is stored at most once however often it is retried.
        """
        names = [channels] if isinstance(channels, str) else list(channels)
        return self._publish({"channels": names, "data": data}, idempotency_key)

    def publish_batch(self, messages: Iterable[tuple[str | Sequence[str], Any]], *,
                      idempotency_key: str | None = None) -> Published:
        """Publish several ``(channels, data)`` messages in one request, in
        order, all or nothing; the receipts come back in the same order."""
        body = [{"channels": [c] if isinstance(c, str) else list(c), "data": d}
                for c, d in messages]
        return self._publish({"messages": body}, idempotency_key)

    def _publish(self, body: dict[str, Any], key: str | None) -> Published:
        key = key or str(uuid.uuid4())
        response = self._send("POST", "/publish", what="publish", body=body,
                              headers={"Idempotency-Key": key, **self._auth()},
                              idempotency_key=key)
        answer = response.json()
        listed = answer["messages"] if "messages" in body else [answer]
        return Published(tuple(Receipt.from_json(m) for m in listed),
                         response.status_code == 201, response.status_code, key)

    # -- channels ----------------------------------------------------------------

    def create_channel(self, name: str | None = None, ttl: float | None = None) -> ChannelInfo:
        """Create a channel (a generated unique name when ``name`` is None).
        A taken name is ``APIError`` 409 ``channel_exists``; so is a retried
        create whose first attempt was stored but not answered."""
        body: dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if ttl is not None:
            body["ttl"] = ttl
        response = self._send("POST", "/channels", what="create_channel", body=body,
                              headers=self._auth())
        return ChannelInfo.from_json(response.json())

    def renew_channel(self, name: str, ttl: float | None = None) -> ChannelInfo:
        """Push a channel's expiry to now + ``ttl`` (its own ttl if None)."""
        body = {} if ttl is None else {"ttl": ttl}
        response = self._send("POST", f"/channels/{quote_name(name)}/renew", what="renew_channel",
                              body=body, headers=self._auth())
        return ChannelInfo.from_json(response.json())

    def channel_info(self, name: str) -> ChannelInfo:
        """A channel's expiry, cached messages and waiting subscribers;
        ``APIError`` 404 ``no_such_channel`` if there is none."""
        response = self._send("GET", f"/channels/{quote_name(name)}", what="channel_info",
                              headers=self._auth())
        return ChannelInfo.from_json(response.json())

    def delete_channel(self, name: str) -> None:
        """Delete a channel and its messages; its subscribers see it ``Closed``.
        ``APIError`` 404 if there is none (also for a retried delete whose
        first attempt was done but not answered)."""
        self._send("DELETE", f"/channels/{quote_name(name)}", what="delete_channel",
                   headers=self._auth())

    # -- subscribing ---------------------------------------------------------------

    def subscribe(self, channels: str | Sequence[str], since: str | float = "now", *,
                  token: str | None = None, poll_timeout: float = 30.0,
                  limit: int | None = None,
                  max_failures: int | None = None) -> Subscription:
        """Follow ``channels`` from ``since`` ("now", a cursor a previous
        subscription exposed, or a Unix time). See ``Subscription``."""
        names = [channels] if isinstance(channels, str) else list(channels)
        return Subscription(self, names, since, token, poll_timeout, limit, max_failures)

    # -- the one request path --------------------------------------------------------

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.publish_token}"} if self.publish_token else {}

    def _send(self, method: str, path: str, *, what: str, body: Any = None,
              params: dict[str, str] | None = None, headers: dict[str, str] | None = None,
              timeout: float | None = None, idempotency_key: str | None = None,
              retries: int | None = None) -> httpx.Response:
        """One logical request: answered (< 400), ``APIError`` (4xx), or
        ``Unavailable`` after ``retries`` more attempts, each on the next node."""
        attempts = Attempts(what, (self.retries if retries is None else retries) + 1,
                            self.backoff, idempotency_key)
        content, all_headers = encode(body, headers)
        while True:
            try:
                response = self._http.request(
                    method, self._nodes.current + path, content=content, params=params,
                    headers=all_headers, timeout=self.timeout if timeout is None else timeout)
            except NOT_SENT as e:
                delay = attempts.failed(e, sent=False)
            except httpx.TransportError as e:  # timeouts, resets: it may have been stored
                delay = attempts.failed(e, sent=True)
            else:
                if response.status_code < 400:
                    return response
                delay = attempts.answered(response.status_code, *error_of(response),
                                          response.headers.get("Retry-After"))
            self._nodes.advance()
            time.sleep(delay)


class Subscription(Following, Iterator[Event]):
    """A long-polling subscription, iterated for ``Message``, ``Gap`` and
    ``Closed`` items in order; the iteration blocks until there is one.

    - Every message published to the channels after ``since`` comes once,
      whichever node answers each poll (the server's cursor guarantees it).
    - A ``Gap`` comes (before that response's messages) when messages after
      the position may be missing: evicted unread, or the node restarted
      without ``--data-dir`` (then reported even if nothing was lost; see
      ``Gap``). What is missing is not coming.
    - A ``Closed`` names deleted channels; they are dropped, and the iteration
      ends when no channel is left. (A long poll learns of a delete while it
      waits on the channel; one made between two polls goes unseen, and the
      next poll names a new, empty channel.)
    - Errors, timeouts and 5xx are retried forever (or ``max_failures``
      times in a row, then ``Unavailable``) on the next node with backoff;
      a 4xx raises ``APIError`` at once (a bad name, an expired token).

    ``cursor`` is where to resume so that nothing handed out and finished is
    repeated and nothing else is lost: read it after handling an item and
    persist it; pass it back as ``since``. (Within one response it stays
    at the response's start until its last item is handed out, so a resume
    may repeat items of that response: dedupe by ``Message.id`` if that
    matters.) ``poll()`` is one round, for callers with their own loop.
    """

    def __init__(self, client: Client, channels: list[str], since: str | float,
                 token: str | None, poll_timeout: float, limit: int | None,
                 max_failures: int | None) -> None:
        self._client = client
        self._reading = Reading(channels, since, token, limit)
        self.poll_timeout = poll_timeout
        self.max_failures = max_failures

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Event:
        reading = self._reading
        while not reading.pending:
            if reading.done:
                raise StopIteration
            reading.pending.extend(self._round(self.poll_timeout))
        return reading.pending.popleft()

    def poll(self, timeout: float | None = None) -> list[Event]:
        """One round (``timeout`` seconds held at most, 0 = answer at once):
        the items it brought, possibly none. Items still buffered by the
        iteration come first."""
        if self._reading.pending:
            return self._reading.drain()
        if self._reading.done:
            return []
        return self._round(self.poll_timeout if timeout is None else timeout)

    def _round(self, hold: float) -> list[Event]:
        params, headers = self._reading.request(hold)
        response = self._client._send("GET", "/subscribe", what="subscribe", params=params,
                                      headers=headers, timeout=hold + self._client.timeout,
                                      retries=self._retries())
        return self._reading.take(response.json())
