"""pushup.client against real nodes: what a web app or worker relies on.

Exactly once across a node SIGKILL behind HAProxy, a 202 said as such, a
504/503 retried with the same Idempotency-Key and stored once, a 4xx raised
with its code and never retried, a gap and a closed channel reported, tokens
minted, and examples/flask_app.py publishing through Flask's test client.
Each test starts its own nodes (fresh_cluster) and stops them by PID.
"""
from __future__ import annotations

import asyncio
import importlib.util
import threading
from pathlib import Path

import httpx
import pytest

from pushup.client import (
    APIError,
    AsyncClient,
    Backoff,
    Client,
    Closed,
    Gap,
    Message,
    Unavailable,
    mint_token,
)
from tests.cluster.clients import retained, uniq, wait_until

FAST = Backoff(base=0.05, cap=0.5)
SUBSCRIBE_SECRET = "a-subscribe-secret-of-32-bytes-or-more"


class Recorder:
    """httpx event hooks that note every attempt: (Idempotency-Key, status)."""

    def __init__(self) -> None:
        self.keys: list[str | None] = []
        self.statuses: list[int] = []
        self.lock = threading.Lock()

    def client(self, timeout: float = 10.0) -> httpx.Client:
        return httpx.Client(timeout=timeout, event_hooks={"request": [self.on_request],
                                                          "response": [self.on_response]})

    def on_request(self, request: httpx.Request) -> None:
        with self.lock:
            self.keys.append(request.headers.get("Idempotency-Key"))

    def on_response(self, response: httpx.Response) -> None:
        with self.lock:
            self.statuses.append(response.status_code)


def test_a_subscriber_behind_haproxy_gets_every_message_once_while_a_node_is_killed(
        fresh_cluster):
    c = fresh_cluster(3, haproxy=True)
    channel = uniq("once")
    total, kill_at = 60, 20
    subscriber = Client(c.front_url, backoff=FAST)
    subscription = subscriber.subscribe(channel, since="now", poll_timeout=2)
    assert subscription.poll(timeout=0) == []  # "now" resolved to a cursor before publishing
    received: list[Message] = []
    everything = threading.Event()
    stop = threading.Event()
    problems: list[BaseException] = []

    def follow() -> None:
        try:
            while not stop.is_set():
                for item in subscription.poll(timeout=1):
                    assert isinstance(item, Message), item
                    received.append(item)
                if len({m.data for m in received}) >= total:
                    everything.set()
        except BaseException as e:  # reported by the test
            problems.append(e)
            everything.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    receipts = []
    with Client(c.front_url, retries=30, backoff=FAST) as publisher:
        for n in range(total):
            if n == kill_at:
                c.kill(1)  # SIGKILL, in the middle of the stream
            receipts.append(publisher.publish(channel, n))
    assert everything.wait(60), f"received {len(received)} of {total}"
    stop.set()
    reader.join(30)
    assert not problems, problems
    for _ in range(3):  # late duplicates would show on a further poll
        received += [i for i in subscription.poll(timeout=0) if isinstance(i, Message)]
    subscriber.close()
    assert sorted(m.data for m in received) == list(range(total))
    assert sorted(m.id for m in received) == sorted(r.id for r in receipts)


def test_a_publish_only_one_node_holds_is_returned_as_not_acknowledged(fresh_cluster):
    c = fresh_cluster(2, haproxy=False, node_args=["--publish-ack-timeout", "0.5"])
    c.kill(1)  # the only peer
    with Client(c.bases[0], backoff=FAST) as pushup:
        sent = pushup.publish(uniq("alone"), "held here only")
    assert (sent.status, sent.acknowledged) == (202, False)
    assert sent.id and sent.messages[0].channels


def test_a_publish_redis_did_not_answer_is_retried_with_its_key_and_stored_once(
        fresh_cluster, redis_server):
    c = fresh_cluster(1, haproxy=False, engine=redis_server.url)
    channel = uniq("redis")
    attempts = Recorder()
    pushup = Client(c.bases[0], retries=40, backoff=FAST, http_client=attempts.client())
    outcome: list[object] = []
    redis_server.pause()  # SIGSTOP: the node sends the publish and gets no answer
    try:
        worker = threading.Thread(target=lambda: outcome.append(pushup.publish(channel, "x")),
                                  daemon=True)
        worker.start()
        wait_until(lambda: 504 in attempts.statuses, 20, 0.05, "a 504 outcome_unknown")
    finally:
        redis_server.resume()
    worker.join(60)
    (sent,) = outcome
    assert sent.acknowledged  # type: ignore[attr-defined]
    assert len(attempts.keys) >= 2 and len(set(attempts.keys)) == 1, attempts.keys
    assert attempts.keys[0] == sent.idempotency_key  # type: ignore[attr-defined]
    assert list(retained(c.bases[0], [channel])) == [sent.id]  # type: ignore[attr-defined]


def test_a_publish_refused_while_redis_is_down_is_retried_after_retry_after_and_stored_once(
        fresh_cluster, redis_server):
    c = fresh_cluster(1, haproxy=False, engine=redis_server.url)
    channel = uniq("down")
    attempts = Recorder()
    pushup = Client(c.bases[0], retries=60, backoff=FAST, http_client=attempts.client())
    outcome: list[object] = []
    redis_server.kill()  # the node cannot send anything: 503 engine_unavailable, Retry-After
    worker = threading.Thread(target=lambda: outcome.append(pushup.publish(channel, "y")),
                              daemon=True)
    worker.start()
    wait_until(lambda: 503 in attempts.statuses, 20, 0.05, "a 503 engine_unavailable")
    redis_server.restart()  # same port, empty
    worker.join(90)
    (sent,) = outcome
    assert attempts.statuses[-1] == 201 and len(set(attempts.keys)) == 1, attempts.statuses
    assert list(retained(c.bases[0], [channel])) == [sent.id]  # type: ignore[attr-defined]


def test_a_refused_request_raises_its_status_and_code_and_is_not_retried(fresh_cluster):
    c = fresh_cluster(1, haproxy=False, node_args=["--publish-token", "right"])
    attempts = Recorder()
    with Client(c.bases[0], publish_token="wrong", http_client=attempts.client()) as pushup:
        with pytest.raises(APIError) as refused:
            pushup.publish("news", 1)
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    assert attempts.statuses == [401]
    with Client(c.bases[0], publish_token="right") as pushup:
        with pytest.raises(APIError) as bad_name:
            pushup.publish("a,b", 1)
        assert (bad_name.value.status, bad_name.value.code) == (400, "bad_channel_name")
        with pytest.raises(APIError) as missing:
            pushup.channel_info(uniq("none"))
        assert (missing.value.status, missing.value.code) == (404, "no_such_channel")


def test_nothing_listening_is_unavailable_with_nothing_stored(fresh_cluster):
    c = fresh_cluster(1, haproxy=False)
    base = c.bases[0]
    c.kill(0)
    with Client(base, retries=2, backoff=FAST) as pushup, pytest.raises(Unavailable) as down:
        pushup.publish("news", 1, idempotency_key="k-1")
    assert (down.value.attempts, down.value.outcome_unknown) == (3, False)
    assert down.value.idempotency_key == "k-1"


def test_a_subscriber_away_while_history_was_evicted_gets_a_gap_then_what_is_left(
        fresh_cluster):
    c = fresh_cluster(1, haproxy=False, node_args=["--max-messages-per-channel", "3"])
    channel = uniq("gap")
    with Client(c.bases[0]) as pushup:
        subscription = pushup.subscribe(channel, since="now", poll_timeout=5)
        subscription.poll(timeout=0)
        pushup.publish(channel, 0)
        assert [i.data for i in subscription.poll() if isinstance(i, Message)] == [0]
        for n in range(1, 11):  # away: 10 more, the cap keeps 3
            pushup.publish(channel, n)
        gap, *rest = subscription.poll()
    assert isinstance(gap, Gap) and gap.cursor == subscription.cursor
    assert [m.data for m in rest if isinstance(m, Message)] == [8, 9, 10]


def test_channels_are_managed_and_a_deleted_one_ends_its_subscription(fresh_cluster):
    c = fresh_cluster(2, haproxy=False)
    with Client(c.bases[1]) as manager, Client(c.bases[0]) as reader:
        made = manager.create_channel(ttl=60)
        assert made.name
        with pytest.raises(APIError) as taken:
            manager.create_channel(made.name)
        assert taken.value.code == "channel_exists"
        assert manager.renew_channel(made.name, ttl=600).expires_at > made.expires_at
        sent = manager.publish(made.name, {"k": 1})
        wait_until(lambda: reader.channel_info(made.name).messages == 1, 10, 0.05,
                   "node 1 holds the message")
        items = []
        for item in reader.subscribe(made.name, since=0, poll_timeout=30):
            items.append(item)
            if isinstance(item, Message):  # delete while the next poll waits on it
                threading.Thread(target=delete_once_waited_on, daemon=True,
                                 args=(reader, manager, made.name)).start()
    assert items == [Message(sent.id, sent.timestamp, (made.name,), {"k": 1}),
                     Closed((made.name,))]


def delete_once_waited_on(reader: Client, manager: Client, channel: str) -> None:
    wait_until(lambda: reader.channel_info(channel).subscribers == 1, 10, 0.02,
               "the subscription waits on the channel")
    manager.delete_channel(channel)


def test_a_minted_token_subscribes_and_none_is_refused(fresh_cluster):
    c = fresh_cluster(1, haproxy=False, node_args=["--subscribe-secret", SUBSCRIBE_SECRET])
    with Client(c.bases[0]) as pushup:
        token = mint_token(SUBSCRIBE_SECRET, ["room:*"], ttl=60)
        assert pushup.subscribe("room:1", token=token).poll(timeout=0) == []
        with pytest.raises(APIError) as refused:
            pushup.subscribe("room:1").poll(timeout=0)
        assert (refused.value.status, refused.value.code) == (401, "unauthorized")
        with pytest.raises(APIError) as forbidden:
            pushup.subscribe("other", token=token).poll(timeout=0)
        assert forbidden.value.code == "forbidden"


def test_an_async_subscription_moves_to_another_node_when_its_node_is_killed(fresh_cluster):
    c = fresh_cluster(2, haproxy=False)
    channel = uniq("async")

    def waited_on() -> list[int]:  # [the node holding the poll], or [] for none yet
        for i, base in enumerate(c.bases):
            with Client(base) as node:
                if node.channel_info(channel).subscribers:
                    return [i]
        return []

    async def scenario() -> list[object]:
        async with AsyncClient(c.bases, backoff=FAST) as pushup:
            subscription = pushup.subscribe(channel, since="now", poll_timeout=30)
            assert await subscription.poll(timeout=0) == []
            first = await pushup.publish_batch([(channel, 1), (channel, 2)])
            got = [m async for m in first_n(subscription, 2)]
            reading = asyncio.create_task(anext(subscription))
            (held,) = await asyncio.to_thread(wait_until, waited_on, 10, 0.02, "a held poll")
            c.kill(held)  # the node holding the poll
            again = await pushup.publish(channel, 3)  # on the node left
            got.append(await asyncio.wait_for(reading, 60))
            return [first, again, got]

    first, again, got = asyncio.run(scenario())
    assert [m.id for m in got] == [*(r.id for r in first.messages), again.id]  # type: ignore
    assert [m.data for m in got] == [1, 2, 3]  # type: ignore[attr-defined]


async def first_n(subscription, n: int):
    async for item in subscription:
        yield item
        n -= 1
        if n == 0:
            return


def load_example():
    path = Path(__file__).resolve().parents[2] / "examples" / "flask_app.py"
    spec = importlib.util.spec_from_file_location("flask_app_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_flask_example_publishes_what_its_route_is_posted(fresh_cluster):
    c = fresh_cluster(1, haproxy=False, node_args=["--publish-token", "pt"])
    app = load_example().create_app([c.bases[0]], publish_token="pt",
                                    subscribe_secret="ignored")
    web = app.test_client()
    answer = web.post("/rooms/42/messages", json={"text": "hello"})
    assert answer.status_code == 201 and answer.json["acknowledged"] is True
    with Client(c.bases[0]) as pushup:
        (got,) = pushup.subscribe("chat:42", since=0).poll(timeout=0)
    assert isinstance(got, Message) and (got.id, got.data) == (answer.json["id"],
                                                                {"text": "hello"})
    refused = web.post("/rooms/a,b/messages", json={"text": "hello"})
    assert refused.status_code == 400 and refused.json["error"] == "bad_channel_name"
