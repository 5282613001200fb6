"""pushup/core/service.py over time: holding, answering, timeouts, fan-out, retention, drain.

Driven through a real in-memory node (see conftest.py) on a ``task.Clock``:
nothing sleeps, and every timer the service arms is visible on the clock.
"""

from __future__ import annotations

from typing import Any

from pushup.core.model import Draft, Query
from pushup.core.service import SLICE, Delivery

START = 1_763_800_000.0


class Recorder:
    """A Subscriber that records what it was answered with."""

    def __init__(self, present: bool = True) -> None:
        self.deliveries: list[Delivery] = []
        self.present = present

    def respond(self, delivery: Delivery, hold: bool = False) -> bool:
        self.deliveries.append(delivery)
        return self.present


def ids(response: Any) -> list[Any]:
    return [m["data"] for m in response.json["messages"]]


# -- holding and answering -------------------------------------------------


def test_the_publisher_is_answered_before_the_fan_out_starts(node):
    held = node.subscribe("a", timeout=30)
    service = node.service
    service.publish([Draft(("a",), b"1")])
    assert held.response is None  # publish returned: the publisher's 201 goes out first
    node.turn()
    assert ids(held.response) == [1]


def test_held_subscribe_is_answered_by_publish(node):
    held = node.subscribe("news", timeout=30)
    assert held.response is None
    assert node.stats()["waiting"] == 1

    published = node.publish("news", {"n": 1})
    assert published.status == 201

    answer = held.response
    assert answer is not None and answer.status == 200
    body = answer.json
    assert [m["data"] for m in body["messages"]] == [{"n": 1}]
    assert body["messages"][0]["id"] == published.json["id"]
    assert body["messages"][0]["channels"] == ["news"]
    assert body["closed"] == []
    assert body["cursor"]
    assert node.stats()["waiting"] == 0


def test_publish_to_another_channel_leaves_subscriber_held(node):
    held = node.subscribe("a", timeout=30)
    node.publish("b", 1)
    assert held.response is None
    node.publish("a", 2)
    assert ids(held.response) == [2]


def test_held_subscribe_times_out_with_empty_messages_and_working_cursor(node):
    node.publish("t", "before")
    first = node.subscribe("t", since=0, timeout=0).response
    assert ids(first) == ["before"]

    held = node.subscribe("t", since=first.json["cursor"], timeout=10)
    node.clock.advance(9.999)
    assert held.response is None, "answered before its timeout"
    node.clock.advance(0.001)
    answer = held.response
    assert answer is not None and answer.status == 200
    assert answer.json["messages"] == []
    assert answer.json["closed"] == []
    assert not answer.json.get("gap", False)
    cursor = answer.json["cursor"]
    assert cursor

    node.publish("t", "after")
    again = node.subscribe("t", since=cursor, timeout=0).response
    assert ids(again) == ["after"]


def test_timeout_zero_answers_at_once_with_nothing(node):
    answer = node.subscribe("quiet", timeout=0).response
    assert answer is not None and answer.status == 200
    assert answer.json["messages"] == []
    assert answer.json["cursor"]


def test_cached_messages_answer_at_once(node):
    node.publish("c", 1)
    node.publish("c", 2)
    answer = node.subscribe("c", timeout=30).response
    assert answer is not None
    assert ids(answer) == [1, 2]


def test_until_in_the_past_answers_at_once(node):
    answer = node.subscribe("c", until=START - 10, timeout=30).response
    assert answer is not None and answer.json["messages"] == []


def test_timeout_is_capped_by_max_timeout(make_node):
    node = make_node(max_timeout=5)
    held = node.subscribe("c", timeout=1000)
    node.clock.advance(4.9)
    assert held.response is None
    node.clock.advance(0.1)
    assert held.response is not None and held.response.json["messages"] == []


def test_subscribers_with_different_deadlines_time_out_in_order(node):
    late = node.subscribe("c", timeout=20)
    early = node.subscribe("c", timeout=5)
    node.clock.advance(5)
    assert early.response is not None
    assert late.response is None
    node.clock.advance(15)
    assert late.response is not None


def test_held_subscriber_with_a_limit_gets_at_most_that_many(node):
    held = node.subscribe("a", timeout=30, limit=2)
    node.post("/publish", {"messages": [{"channels": ["a"], "data": i} for i in range(5)]})
    first = held.response.json
    assert [m["data"] for m in first["messages"]] == [0, 1]
    rest = node.subscribe("a", since=first["cursor"], timeout=0).response
    assert ids(rest) == [2, 3, 4]


def test_message_on_two_subscribed_channels_is_delivered_once(node):
    held = node.subscribe("x,y", timeout=30)
    node.publish(["x", "y", "z"], "m")
    messages = held.response.json["messages"]
    assert len(messages) == 1
    # "channels" lists which of the *subscribed* channels it was on.
    assert messages[0]["channels"] == ["x", "y"]


# -- timers ----------------------------------------------------------------


def test_no_timer_is_left_once_nothing_waits_and_nothing_is_cached(make_node):
    node = make_node(message_ttl=10, channel_ttl=30)
    held = node.subscribe("a", timeout=5)
    node.publish("b", "m")
    node.clock.advance(5)
    assert held.response is not None
    held.close()
    node.clock.advance(30)  # past message ttl and channel ttl
    stats = node.stats()
    assert (stats["waiting"], stats["messages"], stats["channels"]) == (0, 0, 0)
    assert node.clock.getDelayedCalls() == []


def test_disconnected_subscriber_leaves_no_timer_and_no_waiter(make_node):
    node = make_node(channel_ttl=30)
    held = node.subscribe("a", timeout=100)
    deadline = START + 100
    assert node.stats()["waiting"] == 1
    assert deadline in node.pending_times()

    held.close()  # the client hangs up while waiting

    assert node.stats()["waiting"] == 0
    assert deadline not in node.pending_times(), "a timer is left for a gone client"
    # The only thing left is retention of the channel the subscribe created.
    assert all(t <= START + 31 for t in node.pending_times())
    node.clock.advance(31)
    assert node.clock.getDelayedCalls() == []
    assert node.stats()["channels"] == 0


def test_disconnected_subscriber_gets_no_delivery(node):
    gone = node.subscribe("a", timeout=100)
    stays = node.subscribe("a", timeout=100)
    gone.close()
    node.publish("a", 1)
    assert stays.response is not None
    assert gone.transport.value() == b""
    assert node.stats()["delivered"] == 1


def test_disconnect_of_the_earliest_waiter_keeps_the_later_one_timed(node):
    early = node.subscribe("a", timeout=5)
    late = node.subscribe("a", timeout=10)
    early.close()
    node.clock.advance(10)
    assert late.response is not None and late.response.json["messages"] == []


# -- fan-out ---------------------------------------------------------------


def test_a_fan_out_leaves_none_of_its_answers_cached(node):
    writer = node.node.front.writer
    small = [node.subscribe(f"few{i}", timeout=60) for i in range(3)]
    for i in range(3):
        node.publish(f"few{i}", "x" * 10_000)
    node.clock.advance(0)
    assert node.answered(small) == 3
    assert writer.shared_bytes == 0  # no later tick or fan-out was needed
    big = [node.subscribe("many", timeout=60) for _ in range(SLICE + 10)]
    node.publish("many", "y" * 10_000)
    # the first slice: the shared answer stays cached while the rest wait
    assert node.answered(big) == SLICE and writer.shared_bytes > 10_000
    assert node.turn() == 1
    assert node.answered(big) == SLICE + 10
    assert writer.shared_bytes == 0


def test_fan_out_is_answered_in_slices_that_yield_to_the_reactor(node):
    total = 2 * SLICE + 200
    waiters = [node.subscribe("big", timeout=60) for _ in range(total)]
    assert node.answered(waiters) == 0
    assert node.stats()["waiting"] == total

    node.publish("big", "hello")
    assert node.answered(waiters) == SLICE
    assert node.turn() == 1  # the rest waits for the next reactor turn
    assert node.answered(waiters) == 2 * SLICE
    assert node.turn() == 1
    assert node.answered(waiters) == total
    assert node.turn() == 0  # nothing more was scheduled

    for conn in waiters:
        assert ids(conn.response) == ["hello"]
    assert node.stats()["delivered"] == total


PULL = b"GET /subscribe?channels=other&timeout=0 HTTP/1.1\r\nHost: x\r\n\r\n"


def test_clients_answered_early_in_a_fan_out_wait_for_its_end_before_their_next_request(node):
    total = 2 * SLICE + 10
    waiters = [node.subscribe("big", timeout=60) for _ in range(total)]

    node.publish("big", "hello")
    first = waiters[:SLICE]
    for conn in first:  # each re-polls at once; a pull is otherwise answered at once
        conn.protocol.dataReceived(PULL)
    assert all(len(c.responses()) == 1 for c in first)
    bystander = node.open("GET", "/subscribe?channels=other&timeout=0")
    assert bystander.response is not None  # others are still served meanwhile
    while node.turn():
        pass
    assert node.answered(waiters) == total
    assert all(len(c.responses()) == 2 for c in first)


def test_a_fan_out_cut_short_by_drain_releases_everyone(node):
    waiters = [node.subscribe("big", timeout=60) for _ in range(SLICE + 10)]
    node.publish("big", "hello")
    waiters[0].protocol.dataReceived(PULL)
    assert len(waiters[0].responses()) == 1
    node.node.service.drain()
    assert node.answered(waiters) == SLICE + 10
    assert len(waiters[0].responses()) == 2


def test_fan_out_rest_is_answered_by_clock_advance_zero(node):
    waiters = [node.subscribe("big", timeout=60) for _ in range(SLICE + 200)]
    node.publish("big", "hello")
    assert node.answered(waiters) == SLICE
    node.clock.advance(0)
    assert node.answered(waiters) == SLICE + 200
    assert all(ids(conn.response) == ["hello"] for conn in waiters)


def test_equal_queries_share_one_body_over_http(node):
    same = [node.subscribe("s", timeout=60) for _ in range(5)]
    other = node.subscribe("s,t", timeout=60)
    node.publish(["s", "t"], {"x": 1})
    bodies = {conn.response.body for conn in same}
    assert len(bodies) == 1
    assert other.response.body not in bodies  # a different query lists other channels


def test_equal_queries_share_one_delivery_object(node):
    service = node.service
    query = Query(("s",), 0, None, 100)
    recorders = [Recorder() for _ in range(3)]
    for r in recorders:
        service.subscribe(Query(("s",), 0, None, 100), 30, r)
    service.publish([Draft(("s",), b'"m"')])
    node.turn()  # answers go out on the reactor's next turn
    deliveries = [r.deliveries[0] for r in recorders]
    assert all(d is deliveries[0] for d in deliveries), "equal queries got separate answers"
    assert len(deliveries[0].result.messages) == 1 and deliveries[0].closed == ()
    assert query == Query(("s",), 0, None, 100)


def test_batch_publish_answers_a_waiter_once_with_both_messages(node):
    held = node.subscribe("a", timeout=30)
    batch = node.post("/publish", {"messages": [{"channels": ["a"], "data": 1},
                                                {"channels": ["a", "b"], "data": 2}]})
    assert batch.status == 201
    responses = held.responses()
    assert len(responses) == 1
    assert ids(responses[0]) == [1, 2]
    assert node.stats()["delivered"] == 2


def test_subscriber_that_is_gone_is_not_counted_as_delivered(node):
    service = node.service
    present, gone = Recorder(), Recorder(present=False)
    service.subscribe(Query(("a",), 0, None, 100), 30, present)
    service.subscribe(Query(("a",), 0, None, 100), 30, gone)
    service.publish([Draft(("a",), b"1")])
    node.turn()
    assert len(gone.deliveries) == 1
    assert service.counters.delivered == 1


# -- closing channels ------------------------------------------------------


def test_closing_a_channel_answers_its_waiters_with_closed(node):
    on_it = node.subscribe("doomed", timeout=60)
    on_both = node.subscribe("doomed,kept", timeout=60)
    elsewhere = node.subscribe("kept", timeout=60)

    deleted = node.request("DELETE", "/channels/doomed")
    assert deleted.status == 204

    for conn in (on_it, on_both):
        answer = conn.response
        assert answer is not None and answer.status == 200
        assert answer.json["closed"] == ["doomed"]
        assert answer.json["messages"] == []
    assert elsewhere.response is None
    assert node.stats()["waiting"] == 1


def test_closing_a_channel_forgets_its_messages(node):
    node.publish("gone", 1)
    assert node.request("DELETE", "/channels/gone").status == 204
    assert node.stats()["messages"] == 0
    assert node.get("/channels/gone").status == 404


# -- draining --------------------------------------------------------------


def test_drain_answers_everyone_at_once(node):
    waiters = [node.subscribe("d", timeout=60) for _ in range(SLICE + 100)]
    node.service.drain()
    assert node.answered(waiters) == len(waiters)  # no clock.advance needed
    assert all(conn.response.json["messages"] == [] for conn in waiters)
    assert node.stats()["waiting"] == 0


def test_draining_node_refuses_publish_with_503(node, check_error):
    node.service.drain()
    check_error(node.publish("d", 1), 503, "shutting_down")
    assert node.stats()["published"] == 0


def test_draining_node_reports_unhealthy(node, check_error):
    assert node.get("/health").status == 200
    node.service.drain()
    check_error(node.get("/health"), 503, "shutting_down")


def test_draining_node_answers_subscribe_at_once(node):
    node.service.drain()
    answer = node.subscribe("d", timeout=60).response
    assert answer is not None and answer.status == 200


def test_drain_leaves_no_service_timer(node):
    held = node.subscribe("d", timeout=60)
    node.publish("d2", 1)
    node.service.drain()
    held.close()
    assert node.clock.getDelayedCalls() == []


def test_node_stop_answers_waiters_and_closes_connections(node):
    waiters = [node.subscribe("d", timeout=60) for _ in range(3)]
    done = node.node.stop()
    assert node.answered(waiters) == 3
    for conn in waiters:
        assert conn.transport.disconnecting
        conn.close()
    assert node.stats  # the node object is still usable for figures
    assert done.called
    assert node.node.service.counters.connections == 0


# -- retention -------------------------------------------------------------


def test_message_ttl_expires_messages_on_the_clock(make_node):
    node = make_node(message_ttl=10, channel_ttl=3600)
    node.publish("m", "old")
    node.clock.advance(5)
    node.publish("m", "young")
    node.clock.advance(5.3)  # "old" is past its ttl (and the 0.25 s sweep grain)
    assert node.stats()["messages"] == 1
    answer = node.subscribe("m", since=0, timeout=0).response
    assert ids(answer) == ["young"]
    assert answer.json.get("gap") is True  # since=0 after an eviction is a gap
    node.clock.advance(5)
    assert node.stats()["messages"] == 0


def test_current_cursor_has_no_gap_after_its_messages_expire(make_node):
    node = make_node(message_ttl=10)
    node.publish("m", 1)
    cursor = node.subscribe("m", since=0, timeout=0).response.json["cursor"]
    node.clock.advance(11)
    answer = node.subscribe("m", since=cursor, timeout=0).response
    assert answer.json["messages"] == []
    assert not answer.json.get("gap", False)


def test_channel_ttl_expires_an_idle_channel(make_node):
    node = make_node(channel_ttl=30)
    node.publish("idle", 1)
    node.clock.advance(29)
    assert node.get("/channels/idle").status == 200
    node.clock.advance(1.3)
    assert node.get("/channels/idle").status == 404
    assert node.stats()["channels"] == 0
    assert node.stats()["messages"] == 0


def test_publish_extends_a_channels_life(make_node):
    node = make_node(channel_ttl=30)
    node.publish("busy", 1)
    node.clock.advance(20)
    node.publish("busy", 2)
    node.clock.advance(20)
    assert node.get("/channels/busy").status == 200
    node.clock.advance(10.3)
    assert node.get("/channels/busy").status == 404


def test_channel_with_a_waiting_subscriber_does_not_expire(make_node):
    node = make_node(channel_ttl=30, max_timeout=120)
    held = node.subscribe("watched", timeout=100)
    node.clock.advance(60)
    info = node.get("/channels/watched")
    assert info.status == 200
    assert info.json["subscribers"] == 1
    node.clock.advance(40)
    assert held.response is not None  # timed out; now nobody waits
    node.clock.advance(61)
    assert node.get("/channels/watched").status == 404


def test_explicit_channel_ttl_and_renew_are_driven_by_the_clock(node):
    created = node.post("/channels", {"name": "short", "ttl": 10})
    assert created.status == 201
    assert created.json["expires_at"] == START + 10
    node.clock.advance(8)
    renewed = node.post("/channels/short/renew", {"ttl": 10})
    assert renewed.status == 200
    assert renewed.json["expires_at"] == START + 18
    node.clock.advance(8)
    assert node.get("/channels/short").status == 200
    node.clock.advance(2.3)
    assert node.get("/channels/short").status == 404


# -- counters --------------------------------------------------------------


def test_delivered_counts_each_subscriber(node):
    held = [node.subscribe("c", timeout=30) for _ in range(3)]
    node.publish("c", 1)
    assert node.answered(held) == 3
    assert node.stats()["delivered"] == 3
    node.subscribe("c", since=0, timeout=0)  # one more, answered from the cache
    assert node.stats()["delivered"] == 4


def test_timeouts_and_closes_deliver_nothing(node):
    node.subscribe("c", timeout=1)
    node.subscribe("d", timeout=60)
    node.clock.advance(1)
    node.request("DELETE", "/channels/d")
    assert node.stats()["delivered"] == 0


def test_published_counts_a_multi_channel_message_once(node):
    node.publish(["a", "b", "c"], 1)
    stats = node.stats()
    assert stats["published"] == 1
    assert stats["messages"] == 1
    node.post("/publish", {"messages": [{"channels": ["a"], "data": 1},
                                        {"channels": ["a", "b"], "data": 2}]})
    assert node.stats()["published"] == 3


def test_refused_publish_counts_nothing(node):
    response = node.post("/publish", {"messages": [{"channels": ["a"], "data": 1},
                                                   {"channels": ["a b"], "data": 2}]})
    assert response.status == 400
    stats = node.stats()
    assert (stats["published"], stats["messages"], stats["channels"]) == (0, 0, 0)


# -- the publish door ------------------------------------------------------


def test_a_publish_the_log_stamped_is_stored_when_next_and_answers_subscribers(node):
    from pushup.core.model import Message

    service = node.service
    held = node.subscribe("a", timeout=30)
    first = [Message("p0.e", 1, 1_763_800_000 * 10**6, ("a",), b"1")]
    assert service.publish_logged(first, current=True) == first
    node.clock.advance(0)
    assert ids(held.response) == [1] and service.counters.published == 1
    later = [Message("p0.e", 3, 1_763_800_001 * 10**6, ("a",), b"3")]  # 2 is not here yet
    service.publish_logged(later, current=True)
    assert service.store.message_count == 1  # the log's tail brings it, in order
    assert service.counters.published == 2
