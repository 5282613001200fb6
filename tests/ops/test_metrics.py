"""pushup/ops/metrics.py through the node: /stats (JSON) and /metrics (Prometheus) agree."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

START = 1_763_800_000.0
API_KEYS = {"node_id", "uptime_s", "connections", "waiting", "channels", "messages",
            "published", "delivered", "bytes_in", "bytes_out", "rss_bytes", "peers"}
# /stats key -> Prometheus sample name
PROMETHEUS = {
    "uptime_s": "pushup_uptime_seconds",
    "connections": "pushup_connections",
    "waiting": "pushup_waiting",
    "channels": "pushup_channels",
    "messages": "pushup_messages",
    "published": "pushup_published_total",
    "delivered": "pushup_delivered_total",
    "bytes_in": "pushup_bytes_in_total",
    "bytes_out": "pushup_bytes_out_total",
}


def samples(text: bytes) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text.decode("utf-8")):
        for sample in family.samples:
            if not sample.labels:
                out[sample.name] = sample.value
    return out


def busy(node):
    """Some traffic: publishes, a delivery to several subscribers, one held."""
    node.publish(["a", "b", "c"], 1)
    held = [node.subscribe("a", since=START, timeout=30) for _ in range(3)]
    node.publish("a", 2)
    node.post("/publish", {"messages": [{"channels": ["d"], "data": 3},
                                        {"channels": ["d"], "data": 4}]})
    node.subscribe("d", timeout=0)
    waiting = node.subscribe("z", timeout=30)
    return held, waiting


def test_stats_has_every_key_of_the_contract(node):
    stats = node.stats()
    assert API_KEYS <= set(stats)
    assert stats["node_id"] == "test"
    for key in API_KEYS - {"node_id", "peers", "uptime_s"}:
        assert isinstance(stats[key], int) and stats[key] >= 0, (key, stats[key])
    assert isinstance(stats["uptime_s"], int | float)
    assert stats["peers"] == []
    assert stats["rss_bytes"] > 0


def test_stats_figures_follow_the_traffic(node):
    busy(node)
    node.clock.advance(2.5)
    stats = node.stats()
    assert stats["published"] == 4  # a 3-channel message counts once; a batch of 2 twice
    assert stats["messages"] == 4
    assert stats["channels"] == 5  # a, b, c, d and z (made by the subscribe)
    assert stats["delivered"] == 3 + 2  # 3 subscribers got message 2; one got 3 and 4
    assert stats["waiting"] == 1
    assert stats["uptime_s"] == 2.5


def test_connections_counts_open_connections(node):
    assert node.stats()["connections"] == 1  # the /stats request itself
    held = [node.subscribe("a", timeout=30) for _ in range(3)]
    assert node.stats()["connections"] == 4
    held[0].close()
    assert node.stats()["connections"] == 3


def test_bytes_in_and_out_are_exact(node):
    busy(node)
    node.get("/health")
    counters = node.service.counters
    assert counters.bytes_in == sum(len(data) for c in node.conns for data in c.sent)
    assert counters.bytes_out == sum(len(c.transport.value()) for c in node.conns)


def test_metrics_text_has_the_same_numbers_as_stats(node):
    busy(node)
    node.clock.advance(1)
    # Read both at the same instant, without I/O in between.
    stats = node.node.stats()
    content_type, text = node.node.metrics()
    assert content_type.startswith(b"text/plain")
    figures = samples(text)
    for key, name in PROMETHEUS.items():
        assert name in figures, name
        assert figures[name] == stats[key], (key, figures[name], stats[key])


def test_metrics_over_http_agree_with_stats_over_http(node):
    busy(node)
    stats = node.stats()
    response = node.get("/metrics")
    assert response.status == 200
    assert response.header("content-type").startswith("text/plain")
    figures = samples(response.body)
    for key in ("waiting", "channels", "messages", "published", "delivered"):
        assert figures[PROMETHEUS[key]] == stats[key], key
    text = response.body.decode()
    assert "pushup_published_total 4.0" in text
    assert "# TYPE pushup_published_total counter" in text


def test_metrics_include_process_figures(node):
    figures = samples(node.get("/metrics").body)
    assert figures["process_resident_memory_bytes"] > 0


def test_head_metrics_and_stats_have_no_body(node):
    for path in ("/metrics", "/stats"):
        response = node.request("HEAD", path)
        assert response.status == 200
        assert response.body == b""
