"""The asyncio client: ``AsyncClient`` and ``AsyncSubscription``, the same
contract as ``pushup.client.sync`` on ``httpx.AsyncClient``.

Retry decisions (``retry.Attempts``) and a subscription's position
(``reading.Reading``) are shared with the blocking client; this module only
awaits where that one blocks.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import httpx

from pushup.client.reading import Following, Reading
from pushup.client.retry import Attempts, Backoff, Rotation
from pushup.client.sync import NOT_SENT, encode, error_of, quote_name
from pushup.client.values import ChannelInfo, Event, Published, Receipt


class AsyncClient:
    """``Client`` for asyncio: the same arguments, methods and exceptions,
    each method a coroutine; ``subscribe`` returns an async iterator."""

    def __init__(self, urls: str | Sequence[str], *, publish_token: str | None = None,
                 timeout: float = 10.0, retries: int = 5, backoff: Backoff | None = None,
                 http_client: httpx.AsyncClient | None = None) -> None:
        self._rng = random.Random()
        self._nodes = Rotation([urls] if isinstance(urls, str) else list(urls), self._rng)
        self.publish_token = publish_token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff or Backoff(rng=self._rng)
        self._http = http_client or httpx.AsyncClient(timeout=timeout)
        self._owns_http = http_client is None

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def publish(self, channels: str | Sequence[str], data: Any, *,
                      idempotency_key: str | None = None) -> Published:
        """See ``Client.publish``."""
        names = [channels] if isinstance(channels, str) else list(channels)
        return await self._publish({"channels": names, "data": data}, idempotency_key)

    async def publish_batch(self, messages: Iterable[tuple[str | Sequence[str], Any]], *,
                            idempotency_key: str | None = None) -> Published:
        """See ``Client.publish_batch``."""
        body = [{"channels": [c] if isinstance(c, str) else list(c), "data": d}
                for c, d in messages]
        return await self._publish({"messages": body}, idempotency_key)

    async def _publish(self, body: dict[str, Any], key: str | None) -> Published:
        key = key or str(uuid.uuid4())
        response = await self._send("POST", "/publish", what="publish", body=body,
                                    headers={"Idempotency-Key": key, **self._auth()},
                                    idempotency_key=key)
        answer = response.json()
        listed = answer["messages"] if "messages" in body else [answer]
        return Published(tuple(Receipt.from_json(m) for m in listed),
                         response.status_code == 201, response.status_code, key)

    async def create_channel(self, name: str | None = None,
                             ttl: float | None = None) -> ChannelInfo:
        body: dict[str, Any] = {}
        if name is not None:
            body["name"] = name
        if ttl is not None:
            body["ttl"] = ttl
        response = await self._send("POST", "/channels", what="create_channel", body=body,
                                    headers=self._auth())
        return ChannelInfo.from_json(response.json())

    async def renew_channel(self, name: str, ttl: float | None = None) -> ChannelInfo:
        response = await self._send("POST", f"/channels/{quote_name(name)}/renew",
                                    what="renew_channel", body={} if ttl is None else {"ttl": ttl},
                                    headers=self._auth())
        return ChannelInfo.from_json(response.json())

    async def channel_info(self, name: str) -> ChannelInfo:
        response = await self._send("GET", f"/channels/{quote_name(name)}",
                                    what="channel_info", headers=self._auth())
        return ChannelInfo.from_json(response.json())

    async def delete_channel(self, name: str) -> None:
        await self._send("DELETE", f"/channels/{quote_name(name)}", what="delete_channel",
                         headers=self._auth())

    def subscribe(self, channels: str | Sequence[str], since: str | float = "now", *,
                  token: str | None = None, poll_timeout: float = 30.0,
                  limit: int | None = None,
                  max_failures: int | None = None) -> AsyncSubscription:
        """See ``Client.subscribe``; iterate with ``async for``."""
        names = [channels] if isinstance(channels, str) else list(channels)
        return AsyncSubscription(self, Reading(names, since, token, limit), poll_timeout,
                                 max_failures)

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.publish_token}"} if self.publish_token else {}

    async def _send(self, method: str, path: str, *, what: str, body: Any = None,
                    params: dict[str, str] | None = None,
                    headers: dict[str, str] | None = None, timeout: float | None = None,
                    idempotency_key: str | None = None,
                    retries: int | None = None) -> httpx.Response:
        """See ``Client._send``."""
        attempts = Attempts(what, (self.retries if retries is None else retries) + 1,
                            self.backoff, idempotency_key)
        content, all_headers = encode(body, headers)
        while True:
            try:
                response = await self._http.request(
                    method, self._nodes.current + path, content=content, params=params,
                    headers=all_headers, timeout=self.timeout if timeout is None else timeout)
            except NOT_SENT as e:
                delay = attempts.failed(e, sent=False)
            except httpx.TransportError as e:
                delay = attempts.failed(e, sent=True)
            else:
                if response.status_code < 400:
                    return response
                delay = attempts.answered(response.status_code, *error_of(response),
                                          response.headers.get("Retry-After"))
            self._nodes.advance()
            await asyncio.sleep(delay)


class AsyncSubscription(Following, AsyncIterator[Event]):
    """``Subscription`` for ``async for``: the same items, cursor and retries."""

    def __init__(self, client: AsyncClient, reading: Reading, poll_timeout: float,
                 max_failures: int | None) -> None:
        self._client = client
        self._reading = reading
        self.poll_timeout = poll_timeout
        self.max_failures = max_failures

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> Event:
        reading = self._reading
        while not reading.pending:
            if reading.done:
                raise StopAsyncIteration
            reading.pending.extend(await self._round(self.poll_timeout))
        return reading.pending.popleft()

    async def poll(self, timeout: float | None = None) -> list[Event]:
        """See ``Subscription.poll``."""
        if self._reading.pending:
            return self._reading.drain()
        if self._reading.done:
            return []
        return await self._round(self.poll_timeout if timeout is None else timeout)

    async def _round(self, hold: float) -> list[Event]:
        params, headers = self._reading.request(hold)
        response = await self._client._send("GET", "/subscribe", what="subscribe",
                                            params=params, headers=headers,
                                            timeout=hold + self._client.timeout,
                                            retries=self._retries())
        return self._reading.take(response.json())
