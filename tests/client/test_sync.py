"""pushup.client.sync on httpx's MockTransport: which node each attempt goes
to, the key it carries, and how answers become items. Real nodes are in
tests/cluster/test_client.py."""
from __future__ import annotations

import json

import httpx
import pytest

from pushup.client import APIError, Backoff, Client, Closed, Gap, Message

NO_WAIT = Backoff(base=0.0, cap=0.0)


def error(status: int, code: str, **headers: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": code}},
                          headers=headers)


def scripted(answers: list[httpx.Response | Exception],
             seen: list[httpx.Request]) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    return httpx.Client(transport=httpx.MockTransport(handle))


RECEIPT = {"id": "n1.1-1", "timestamp": 1763800000.5, "channels": ["a"]}


def test_a_publish_is_retried_on_the_next_node_with_the_same_key() -> None:
    seen: list[httpx.Request] = []
    answers: list[httpx.Response | Exception] = [
        error(503, "shutting_down", **{"Retry-After": "0"}),
        httpx.ReadTimeout("no answer"),
        error(504, "outcome_unknown"),
        httpx.Response(201, json=RECEIPT)]
    pushup = Client(["http://one", "http://two"], backoff=NO_WAIT,
                    http_client=scripted(answers, seen))
    sent = pushup.publish("a", {"x": 1})
    assert (sent.id, sent.acknowledged, sent.status) == ("n1.1-1", True, 201)
    assert len({r.headers["Idempotency-Key"] for r in seen}) == 1
    assert seen[0].headers["Idempotency-Key"] == sent.idempotency_key
    hosts = [r.url.host for r in seen]
    assert all(a != b for a, b in zip(hosts, hosts[1:], strict=False)), hosts
    assert json.loads(seen[0].content) == {"channels": ["a"], "data": {"x": 1}}


def test_a_202_is_returned_as_held_by_one_node_and_a_batch_keeps_its_order() -> None:
    second = {**RECEIPT, "id": "n1.1-2"}
    seen: list[httpx.Request] = []
    pushup = Client("http://one", http_client=scripted(
        [httpx.Response(202, json={"messages": [RECEIPT, second]})], seen))
    sent = pushup.publish_batch([("a", 1), (["a", "b"], 2)], idempotency_key="mine")
    assert (sent.acknowledged, [m.id for m in sent.messages]) == (False, ["n1.1-1", "n1.1-2"])
    assert seen[0].headers["Idempotency-Key"] == "mine"


@pytest.mark.parametrize("status, code", [(400, "bad_channel_name"), (401, "unauthorized"),
                                          (413, "too_large")])
def test_a_4xx_is_raised_after_one_attempt(status: int, code: str) -> None:
    seen: list[httpx.Request] = []
    pushup = Client("http://one", http_client=scripted([error(status, code)], seen))
    with pytest.raises(APIError) as refused:
        pushup.publish("a", 1)
    assert (refused.value.status, refused.value.code, len(seen)) == (status, code, 1)


def message(n: int) -> dict:
    return {"id": f"m{n}", "timestamp": 1763800000.0 + n, "channels": ["a"], "data": n}


def test_a_subscription_reports_a_gap_first_and_a_closed_channel_last_then_ends() -> None:
    seen: list[httpx.Request] = []
    answers: list[httpx.Response | Exception] = [
        error(502, "", **{"Retry-After": "0"}),
        httpx.Response(200, json={"messages": [message(1), message(2)], "cursor": "c1"}),
        httpx.Response(200, json={"messages": [message(3)], "cursor": "c2", "gap": True,
                                  "closed": ["b"]}),
        httpx.Response(200, json={"messages": [], "cursor": "c3", "closed": ["a"]})]
    pushup = Client(["http://one", "http://two"], backoff=NO_WAIT,
                    http_client=scripted(answers, seen))
    subscription = pushup.subscribe(["a", "b"], since="c0")
    first = next(subscription)
    assert first == Message("m1", 1763800001.0, ("a",), 1)
    assert subscription.cursor == "c0"  # m2 is still to come: resume before this answer
    assert next(subscription).data == 2 and subscription.cursor == "c1"
    assert list(subscription) == [Gap("c2"), Message("m3", 1763800003.0, ("a",), 3),
                                  Closed(("b",)), Closed(("a",))]
    sent = [(r.url.params["channels"], r.url.params["since"]) for r in seen]
    assert sent == [("a,b", "c0"), ("a,b", "c0"), ("a,b", "c1"), ("a", "c2")]
