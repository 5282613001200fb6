"""How long things take, as Prometheus histograms, and how requests end.

The node's answers pass through ``Timed`` (a thin wrapper around the
handlers, between them and the HTTP front) and the service's fan-out tells
``Timings.answered``; both only count: an observation is one ``bisect`` and
two additions into plain lists, with no lock (the reactor is one thread) and
no allocation. The figures are read at scrape time by ``figures`` (a plain
dict, so ``--workers`` can put it on the board and sum it) and turned into
metric families by ``families``.

We keep our own histograms rather than ``prometheus_client.Histogram``: its
``observe`` takes a lock per call, and with ``--workers`` its multiprocess
mode keeps one mmapped file per process and metric in a directory, beside
the shared-memory board the workers already write (:mod:`pushup.ops.fleet`).
prometheus_client still writes the exposition text.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from twisted.internet.interfaces import IProtocol
from twisted.python.failure import Failure

from pushup.core.clock import Clock
from pushup.core.errors import PushUpError
from pushup.core.service import Delivery
from pushup.http.exchange import Held, Pending, Request, Response, error_response
from pushup.http.handlers import Client, Handlers

# Upper bounds in seconds (plus +Inf). A publish waits for a peer or Redis (ms);
# a delivery for the fan-out (ms to s); a request may wait for an acknowledgement.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0)
# The endpoints a request is counted under (the first path segment); anything
# else is "other", so a scan of random paths cannot grow the label set.
ENDPOINTS = {b"publish": "publish", b"subscribe": "subscribe", b"channels": "channels",
             b"health": "health", b"stats": "stats", b"metrics": "metrics",
             b"pushup.js": "pushup.js", b"peer": "peer"}


class Histogram:
    """Counts per bucket (not cumulative: ``observe`` adds to one) and a sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float, times: int = 1) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += times
        self.total += seconds * times

    def figures(self) -> list[float]:
        """The counts, then the sum: what the board keeps and sums."""
        return [*self.counts, self.total]


class Row:
    """One endpoint's request durations and answers by status."""

    __slots__ = ("name", "duration", "statuses")

    def __init__(self, name: str) -> None:
        self.name = name
        self.duration = Histogram()
        self.statuses: dict[int, int] = {}


class Timings:
    """This process's histograms and answer counts (see the module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.publish = Histogram()
        self.lag = Histogram()
        self.rows = {name: Row(name) for name in (*ENDPOINTS.values(), "other")}
        self.errors: dict[str, int] = {}  # error code -> count

    def answered(self, delivery: Delivery, subscribers: int) -> None:
        """The fan-out wrote ``delivery`` to ``subscribers`` now: the lag of
        its newest message, from the publish that was accepted to now."""
        messages = delivery.result.messages
        if messages:
            lag = self.clock.seconds() - messages[-1].ts / 1e6
            self.lag.observe(lag if lag > 0 else 0.0, subscribers)

    def error(self, response: Response) -> None:
        code = error_code(response.body or b"")
        self.errors[code] = self.errors.get(code, 0) + 1

    def figures(self) -> dict[str, Any]:
        return {"publish": self.publish.figures(), "lag": self.lag.figures(),
                "requests": {name: row.duration.figures() for name, row in self.rows.items()},
                "responses": {f"{name} {status}": n for name, row in self.rows.items()
                              for status, n in row.statuses.items()},
                "errors": dict(self.errors)}


def error_code(body: bytes) -> str:
    """The ``code`` of the contract's error body, without parsing the JSON."""
    start = body.find(b'"code":"')
    if start < 0:
        return "unknown"
    start += 8
    end = body.find(b'"', start)
    return body[start:end].decode("ascii", "replace")[:40]


class Timed:
    """The handlers, timed: the front's ``App`` (same methods, same answers)."""

    def __init__(self, handlers: Handlers, timings: Timings) -> None:
        self.handlers = handlers
        self.timings = timings
        self.clock = timings.clock
        self._rows = {segment: timings.rows[name] for segment, name in ENDPOINTS.items()}
        # the same rows by whole path, for the paths with one segment (/publish,
        # /subscribe, ...): one lookup, no split, for nearly every request
        self._paths = {b"/" + segment: row for segment, row in self._rows.items()}
        self._other = timings.rows["other"]
        self._publish = timings.rows["publish"]

    def admit(self, method: bytes, path: bytes, headers: dict[bytes, bytes]) -> int | Response:
        return self.handlers.admit(method, path, headers)

    def too_large(self, path: bytes) -> PushUpError:
        return self.handlers.too_large(path)

    def upgrade(self, request: Request) -> IProtocol | None:
        return self.handlers.upgrade(request)

    def handle(self, request: Request, client: Client) -> Response | Held | Pending:
        """Time the answer from the whole request read to the response handed to
        the connection. A held subscribe (a long poll, an event stream) is
        counted as the 200 it will be, and not timed: its time is the wait."""
        began = self.clock.seconds()
        outcome = self.handlers.handle(request, client)
        row = self._paths.get(request.path)
        if row is None:
            row = self._rows.get(request.path[1:].split(b"/", 1)[0], self._other)
        if isinstance(outcome, Response):
            self._done(row, outcome, began)
        elif isinstance(outcome, Pending):
            outcome.answer.addBoth(self._later, row, began)
        else:
            row.statuses[200] = row.statuses.get(200, 0) + 1
        return outcome

    def _done(self, row: Row, response: Response, began: float) -> None:
        took = self.clock.seconds() - began
        row.duration.observe(took)
        status = response.status
        row.statuses[status] = row.statuses.get(status, 0) + 1
        if status >= 400:
            self.timings.error(response)
        elif row is self._publish and status in (201, 202):
            self.timings.publish.observe(took)

    def _later(self, outcome: Response | Held | Failure, row: Row, began: float,
               ) -> Response | Held | Failure:
        """A Pending's answer: a Response timed from the request; a Held (a poll
        held once its channels or stream were read) counted as the 200 it will
        be, as one held at once; a Failure is a bug: the front answers 500."""
        if isinstance(outcome, Held):
            row.statuses[200] = row.statuses.get(200, 0) + 1
        else:
            self._done(row, outcome if isinstance(outcome, Response) else _BUG, began)
        return outcome


_BUG = error_response(PushUpError("the server failed"))


def families(timings: dict[str, Any], engine: str) -> Iterator[Metric]:
    """The metric families of ``Timings.figures()`` (one process's, or summed)."""
    yield _histogram("pushup_publish_latency_seconds",
                     "Publishes answered 201/202: from the request read to the answer",
                     timings["publish"])
    lag = HistogramMetricFamily(
        "pushup_delivery_lag_seconds", "From a publish accepted (its timestamp) to a "
        "subscriber's answer written, per subscriber answered", labels=["engine"])
    lag.add_metric([engine], *_buckets(timings["lag"]))
    yield lag
    requests = HistogramMetricFamily(
        "pushup_request_duration_seconds", "Requests answered, from read to answer (held "
        "subscribes not timed)", labels=["endpoint"])
    for endpoint, figures in sorted(timings["requests"].items()):
        requests.add_metric([endpoint], *_buckets(figures))
    yield requests
    responses = CounterMetricFamily("pushup_responses", "Answers by endpoint and status",
                                    labels=["endpoint", "status"])
    for key, n in sorted(timings["responses"].items()):
        responses.add_metric(key.split(" "), n)
    yield responses
    errors = CounterMetricFamily("pushup_errors", "Error answers by the code of their body",
                                 labels=["code"])
    for code, n in sorted(timings["errors"].items()):
        errors.add_metric([code], n)
    yield errors


def _histogram(name: str, text: str, figures: list[float]) -> HistogramMetricFamily:
    buckets, total = _buckets(figures)
    return HistogramMetricFamily(name, text, buckets=buckets, sum_value=total)


def _buckets(figures: list[float]) -> tuple[list[tuple[str, float]], float]:
    cumulative, buckets = 0.0, []
    for bound, n in zip((*(repr(b) for b in LATENCY_BUCKETS), "+Inf"), figures, strict=False):
        cumulative += n
        buckets.append((bound, cumulative))
    return buckets, figures[-1]


def add(total: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """Two processes' ``figures`` summed (for ``--workers`` and a restarted worker);
    either may be empty (none yet)."""
    if not more:
        return total
    def plus(a: list[float], b: list[float]) -> list[float]:
        return [x + y for x, y in zip(a, b, strict=True)] if a else list(b)

    out: dict[str, Any] = {"publish": plus(total.get("publish", []), more["publish"]),
                           "lag": plus(total.get("lag", []), more["lag"]), "requests": {},
                           "responses": dict(total.get("responses", {})),
                           "errors": dict(total.get("errors", {}))}
    for endpoint, figures in more["requests"].items():
        out["requests"][endpoint] = plus(total.get("requests", {}).get(endpoint, []), figures)
    for kind in ("responses", "errors"):
        for key, n in more[kind].items():
            out[kind][key] = out[kind].get(key, 0) + n
    return out
