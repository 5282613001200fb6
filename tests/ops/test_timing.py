"""pushup/ops/timing.py through an in-memory node: the histograms and answer
counts of /metrics follow the traffic, on the node's clock."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import Deferred

from pushup.core import errors
from pushup.core.model import Draft
from pushup.ops.timing import LATENCY_BUCKETS, Histogram, error_code

START = 1_763_800_000.0


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode("utf-8")):
        for sample in family.samples:
            out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_a_histogram_counts_each_value_in_the_first_bucket_that_holds_it():
    h = Histogram()
    for seconds in (0.0, 0.0005, 0.0006, 0.3, 99.0):
        h.observe(seconds)
    h.observe(0.01, times=3)
    counts = dict(zip((*LATENCY_BUCKETS, "inf"), h.counts, strict=True))
    assert counts[0.0005] == 2 and counts[0.001] == 1 and counts[0.5] == 1
    assert counts[0.01] == 3 and counts["inf"] == 1 and sum(h.counts) == 8
    assert h.total == 0.0005 + 0.0006 + 0.3 + 99.0 + 0.03


def test_error_code_is_read_from_the_contracts_body():
    assert error_code(b'{"error":{"code":"bad_json","message":"x"}}') == "bad_json"
    assert error_code(b"<html>") == "unknown"


def test_metrics_time_requests_count_answers_and_measure_delivery_lag(node):
    held = [node.subscribe("a", timeout=30) for _ in range(3)]
    # A message accepted 0.3 s ago (as one from a peer, or a Redis log, arrives)
    # is written to the three held subscribers now: a lag of 0.3 s each.
    service = node.service
    accepted = service.store.publish([Draft(("a",), b"1")], service.now() - 300_000)
    service.arrived(accepted, service.now())
    node.clock.advance(0)
    assert all(c.response is not None and c.response.status == 200 for c in held)
    assert node.publish("b", 2).status == 201
    assert node.post("/publish", b"{not json").status == 400
    assert node.get("/nowhere").status == 404
    assert node.get("/subscribe?channels=b&timeout=0").status == 200

    figures = samples(node.get("/metrics").body)

    def value(name, **labels):
        return figures[name, tuple(sorted(labels.items()))]

    assert value("pushup_publish_latency_seconds_count") == 1  # the 201, not the 400
    assert value("pushup_publish_latency_seconds_bucket", le="0.0005") == 1  # no clock moved
    lag = {"engine": "single"}
    assert value("pushup_delivery_lag_seconds_count", **lag) == 3
    assert value("pushup_delivery_lag_seconds_bucket", le="0.25", **lag) == 0
    assert value("pushup_delivery_lag_seconds_bucket", le="0.5", **lag) == 3
    assert abs(value("pushup_delivery_lag_seconds_sum", **lag) - 0.9) < 1e-3
    assert value("pushup_request_duration_seconds_count", endpoint="publish") == 2
    assert value("pushup_request_duration_seconds_count", endpoint="other") == 1
    # held subscribes are counted, not timed; the one answered at once is both
    assert value("pushup_request_duration_seconds_count", endpoint="subscribe") == 1
    assert value("pushup_responses_total", endpoint="subscribe", status="200") == 4
    assert value("pushup_responses_total", endpoint="publish", status="201") == 1
    assert value("pushup_responses_total", endpoint="publish", status="400") == 1
    assert value("pushup_responses_total", endpoint="other", status="404") == 1
    assert value("pushup_errors_total", code="bad_json") == 1
    assert value("pushup_errors_total", code="not_found") == 1
    assert value("pushup_engine_up", engine="single") == 1



class ColdEngine:
    """The node's backplane, but each read's channels must be read first (as
    the Redis engine's for a partition it does not follow): ``prepare`` gives a
    Deferred the test fires."""

    def __init__(self, inner):
        self.inner, self.reads = inner, []

    def prepare(self, channels):
        self.reads.append(Deferred())
        return self.reads[-1]

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_poll_held_once_its_channels_were_read_counts_as_the_200_it_will_be(node):
    handlers = node.node.handlers
    handlers.backplane = cold = ColdEngine(handlers.backplane)
    held = node.open("GET", "/subscribe?channels=a&timeout=30")
    refused = node.open("GET", "/subscribe?channels=b&timeout=30")
    cold.reads[0].callback(None)  # read: the poll is held
    cold.reads[1].errback(errors.EngineUnavailable("Redis is unreachable"))
    assert held.response is None and refused.response.status == 503
    handlers.backplane = cold.inner
    assert node.publish("a", 1).status == 201
    node.clock.advance(0)
    assert held.response.status == 200

    figures = samples(node.get("/metrics").body)
    answers = {labels: n for (name, labels), n in figures.items()
               if name == "pushup_responses_total" and ("endpoint", "subscribe") in labels}
    assert answers == {(("endpoint", "subscribe"), ("status", "200")): 1,
                       (("endpoint", "subscribe"), ("status", "503")): 1}
