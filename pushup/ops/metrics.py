"""The node's figures, for ``/stats`` (JSON) and ``/metrics`` (Prometheus).

Both views read the same snapshot, built from the live counters at request
time, so they can never disagree. Labels have fixed cardinality: a peer URL
is a label (peers are configured), a channel name never is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pushup.ops import timing

# (key in /stats, Prometheus name, kind, help)
FIGURES = (
    ("uptime_s", "pushup_uptime_seconds", "gauge", "Seconds since the node started"),
    ("connections", "pushup_connections", "gauge", "Open client connections"),
    ("waiting", "pushup_waiting", "gauge", "Subscriptions held open"),
    ("channels", "pushup_channels", "gauge", "Channels that exist"),
    ("messages", "pushup_messages", "gauge", "Distinct cached messages, every origin"),
    ("cached_bytes", "pushup_cached_bytes", "gauge", "Bytes of cached messages"),
    ("idempotency_keys", "pushup_idempotency_keys", "gauge",
     "Idempotency-Key records remembered, every origin"),
    ("idempotency_bytes", "pushup_idempotency_bytes", "gauge",
     "Bytes of remembered Idempotency-Key records"),
    ("published", "pushup_published", "counter", "Messages accepted from publishers here"),
    ("delivered", "pushup_delivered", "counter", "Messages handed to subscribers"),
    ("bytes_in", "pushup_bytes_in", "counter", "Bytes received from clients"),
    ("bytes_out", "pushup_bytes_out", "counter", "Bytes sent to clients"),
    ("refused", "pushup_refused_connections", "counter", "Connections refused, overloaded"),
)

# Figures only some backplanes have (the mesh's acknowledgements; Redis's
# state, under the "redis" key): the same layout, shown when present.
ENGINE_FIGURES = (
    ("ack_waiting", "pushup_ack_waiting", "gauge", "Publishes waiting for a peer to hold them"),
    ("unconfirmed", "pushup_unconfirmed", "counter",
     "Publishes answered 202: no peer held them in time"),
)
REDIS_FIGURES = (
    ("up", "pushup_redis_up", "gauge", "1 if every connection to Redis is up"),
    ("horizon", "pushup_redis_horizon", "gauge",
     "How far this node has read the Redis logs it follows (entries, summed)"),
    ("followed", "pushup_redis_partitions_followed", "gauge",
     "Partitions of the Redis log with a channel this node follows"),
    ("channels_followed", "pushup_redis_channels_followed", "gauge",
     "Channels this node follows in the Redis log (those its clients read)"),
    ("missed", "pushup_redis_notifications_missed", "counter",
     "Times a notification showed an entry this node never heard of (read back)"),
    ("lost_epochs", "pushup_redis_lost_epochs", "counter",
     "Times a Redis log was found to have lost what this node read"),
)

# With --presence (and --webhook-url): under the "presence" and "webhooks" keys.
PRESENCE_FIGURES = (
    ("presence_subscriptions", "pushup_presence_subscriptions", "gauge",
     "Subscriptions counted here (held, open, or within the presence window)"),
    ("presence_channels", "pushup_presence_channels", "gauge",
     "Channels someone subscribes to, cluster-wide"),
    ("presence_nodes", "pushup_presence_nodes", "gauge", "Nodes whose presence is known here"),
    ("presence_sender", "pushup_presence_sender", "gauge",
     "1 on the one node that says the cluster's presence events (webhooks)"),
)
WEBHOOK_FIGURES = (
    ("sent", "pushup_webhook_events_sent", "counter",
     "Webhook events a receiver accepted (per URL)"),
    ("dropped", "pushup_webhook_events_dropped", "counter",
     "Webhook events given up on: a receiver's queue full, or retried too long"),
    ("failures", "pushup_webhook_failures", "counter", "Webhook requests not answered 2xx"),
    ("queued", "pushup_webhook_events_queued", "gauge", "Webhook events waiting to be sent"),
)

# Durable Streams subscriptions: under the "stream_subscriptions" key.
STREAM_SUBSCRIPTION_FIGURES = (
    ("count", "pushup_stream_subscriptions", "gauge", "Durable Streams subscriptions held"),
    ("wakes", "pushup_stream_subscription_wakes", "counter", "Subscription wakes begun"),
    ("retrying", "pushup_stream_subscriptions_retrying", "gauge",
     "Webhook subscriptions waiting to retry a failed delivery"),
    ("in_flight", "pushup_stream_webhook_in_flight", "gauge",
     "Subscription webhook POSTs under way"),
    ("queued", "pushup_stream_webhook_queued", "gauge",
     "Subscription webhook POSTs waiting for a connection"),
    ("sent", "pushup_stream_webhook_answered", "counter",
     "Subscription webhook POSTs a receiver answered (any status)"),
    ("failed", "pushup_stream_webhook_failed", "counter",
     "Subscription webhook POSTs that got no answer (down, slow, unreachable)"),
    ("dropped", "pushup_stream_webhook_dropped", "counter",
     "Subscription webhook deliveries refused, the queue full (retried with backoff)"),
)
# ... and on a cluster (pushup.backplane.mesh.stream_subscriptions)
STREAM_SUBSCRIPTION_CLUSTER_FIGURES = (
    ("home", "pushup_stream_subscriptions_home", "gauge",
     "1 on the node that holds the cluster's subscriptions, else 0"),
    ("telling", "pushup_stream_subscriptions_telling", "gauge",
     "1 while this node tells the home its streams' news, else 0"),
    ("news_sent", "pushup_stream_subscription_news_batches", "counter",
     "Batches of stream news this node's home took"),
)


def rss_bytes() -> int:
    """Resident memory of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Collector:
    """Prometheus collector over a snapshot function (same data as /stats)."""

    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        stats = self._snapshot()
        yield from _families(FIGURES, stats)
        yield from _families([f for f in ENGINE_FIGURES if f[0] in stats], stats)
        if "redis" in stats:
            yield from _families(REDIS_FIGURES, {k: int(v) for k, v in stats["redis"].items()
                                                 if k in ("up", "horizon", "followed",
                                                          "channels_followed", "missed",
                                                          "lost_epochs")})
        if "presence" in stats:
            yield from _families(PRESENCE_FIGURES, stats["presence"])
        if "webhooks" in stats:
            yield from _families(WEBHOOK_FIGURES, stats["webhooks"])
        if "stream_subscriptions" in stats:
            held = stats["stream_subscriptions"]
            yield from _families(STREAM_SUBSCRIPTION_FIGURES, held)
            if "home" in held:  # a cluster's node
                yield from _families(STREAM_SUBSCRIPTION_CLUSTER_FIGURES, held)
        yield from timing.families(stats["timings"], stats["engine"])
        yield engine_gauge(stats)
        peers = stats["peers"]
        yield from labelled(["peer"], PEER_COLUMNS, (([peer["url"]], peer) for peer in peers))
        state = GaugeMetricFamily("pushup_peer_state", "1 for the peer link's state "
                                  "(connecting, up, down, refused), 0 for the others",
                                  labels=["peer", "state"])
        for peer in peers:
            for name in PEER_STATES:
                state.add_metric([peer["url"], name], 1 if peer["state"] == name else 0)
        yield state


PEER_STATES = ("connecting", "up", "down", "refused")
# (kind, Prometheus name, help, the figure of one row): a family labelled per row
Column = tuple[str, str, str, Callable[[dict[str, Any]], float]]
PEER_COLUMNS: tuple[Column, ...] = (
    ("gauge", "pushup_peer_queued", "Messages queued for a peer", lambda p: p["queued"]),
    ("counter", "pushup_peer_sent", "Messages delivered to a peer", lambda p: p["sent"]),
    ("counter", "pushup_peer_dials", "Connections attempted to a peer", lambda p: p["dials"]),
    ("gauge", "pushup_peer_up", "1 if the peer link is up",
     lambda p: 1 if p["state"] == "up" else 0),
)


def family_of(kind: str) -> type[CounterMetricFamily] | type[GaugeMetricFamily]:
    """The metric family class of a figure's kind ("counter" or "gauge")."""
    return CounterMetricFamily if kind == "counter" else GaugeMetricFamily


def labelled(label_names: list[str], columns: Sequence[Column],
             rows: Iterable[tuple[list[str], dict[str, Any]]]) -> list[Metric]:
    """A family per column, labelled ``label_names``, with a sample per row
    (the row's label values, its figures): a table of peers or workers."""
    families = [(family_of(kind)(name, text, labels=label_names), figure)
                for kind, name, text, figure in columns]
    for labels, row in rows:
        for family, figure in families:
            family.add_metric(labels, figure(row))
    return [family for family, _ in families]


def engine_gauge(stats: dict[str, Any]) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily("pushup_engine_up", "1 while the engine can take a publish "
                              "(caught up; Redis reachable)", labels=["engine"])
    gauge.add_metric([stats["engine"]], stats["engine_up"])
    return gauge


def _families(figures: Any, values: dict[str, Any]) -> Iterator[Metric]:
    for key, name, kind, text in figures:
        yield family_of(kind)(name, text, value=values[key])


def registry_for(snapshot: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    """A registry with our figures plus the process's (memory, CPU, fds)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(snapshot))
    ProcessCollector(registry=registry)
    return registry


def prometheus_text(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
