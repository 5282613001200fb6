"""What a subscription knows between its polls: the channels it still
follows, its position, and the items of the last answer not yet handed out.

Pure: the sync and async subscriptions send the request it describes and
give it the answer's JSON; it never touches the network.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from pushup.client.values import Closed, Event, Gap, Message


class Reading:
    """The state of one subscription. ``cursor`` is where to resume: the
    position before the last answer while some of its items are still
    pending, the position after it once all were handed out."""

    def __init__(self, channels: list[str], since: str | float, token: str | None,
                 limit: int | None) -> None:
        if not channels:
            raise ValueError("subscribe to at least one channel")
        self.channels = list(channels)
        self._start = since if isinstance(since, str) else f"{since:.6f}"
        self._end = self._start
        self.token = token
        self.limit = limit
        self.pending: deque[Event] = deque()

    @property
    def cursor(self) -> str:
        return self._start if self.pending else self._end

    @property
    def done(self) -> bool:
        """Every channel was closed: nothing more can come."""
        return not self.channels

    def request(self, hold: float) -> tuple[dict[str, str], dict[str, str]]:
        """The next poll's query parameters and headers (it starts a round)."""
        self._start = self._end
        params = {"channels": ",".join(self.channels), "since": self._end,
                  "timeout": f"{hold:g}"}
        if self.limit is not None:
            params["limit"] = str(self.limit)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return params, headers

    def take(self, body: dict[str, Any]) -> list[Event]:
        """A 200 answer's items, in order: a ``Gap`` first if it reports one,
        its messages, then ``Closed`` for deleted channels (which are dropped)."""
        items: list[Event] = []
        if body.get("gap"):
            items.append(Gap(body["cursor"]))
        items += [Message.from_json(m) for m in body.get("messages", [])]
        closed = [c for c in body.get("closed", []) if c in self.channels]
        if closed:
            items.append(Closed(tuple(closed)))
            self.channels = [c for c in self.channels if c not in closed]
        self._end = body["cursor"]
        return items

    def drain(self) -> list[Event]:
        items = list(self.pending)
        self.pending.clear()
        return items


FOREVER = 1_000_000_000  # a subscription's retries without max_failures


class Following:
    """What the sync and async subscriptions share around their ``Reading``:
    where to resume, the channels still followed, and how often a round is
    retried. Their rounds differ only in waiting (blocking or ``await``)."""

    _reading: Reading
    poll_timeout: float
    max_failures: int | None

    @property
    def cursor(self) -> str:
        return self._reading.cursor

    @property
    def channels(self) -> list[str]:
        """The channels still followed (closed ones are dropped)."""
        return list(self._reading.channels)

    def _retries(self) -> int:
        """Retries of one round: forever, or ``max_failures`` attempts in all."""
        return FOREVER if self.max_failures is None else max(self.max_failures - 1, 0)
