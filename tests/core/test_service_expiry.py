"""Channel expiry runs on its own clock, whatever else the node is doing.

The service is driven on a ``task.Clock``: a channel named only by a pull
subscribe (``timeout=0``) must expire one ttl later with no other traffic.
"""

from __future__ import annotations

from twisted.internet.task import Clock

from pushup.core.cursor import Cursor
from pushup.core.model import Draft, Origin, Query
from pushup.core.service import Delivery, Service
from pushup.core.store import Retention, Store

S = 1_000_000
START = 1_763_800_000.0


class Recorder:
    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []

    def respond(self, delivery: Delivery, hold: bool = False) -> bool:
        self.deliveries.append(delivery)
        return True


def make_service(channel_ttl: int = 2) -> tuple[Service, Clock]:
    clock = Clock()
    clock.advance(START)
    store = Store(Retention(3600 * S, channel_ttl * S, 1000, 10**9), Origin("me", 0))
    return Service(store, clock, max_timeout=120), clock


def pull(service: Service, *channels: str) -> Delivery:
    answer = service.subscribe(Query(channels, Cursor(()), None, 100), 0, Recorder())
    assert isinstance(answer, Delivery)  # a pull is answered at once
    return answer


def test_channels_named_only_by_pull_subscribes_expire_one_ttl_later() -> None:
    service, clock = make_service(channel_ttl=2)
    for k in range(0, 200, 50):
        pull(service, *(f"pulled-{k + i}" for i in range(50)))
    assert service.store.channel_count == 200
    assert clock.getDelayedCalls(), "no timer is armed to expire the channels"
    clock.advance(1.9)
    assert service.store.channel_count == 200
    clock.advance(0.5)  # past the ttl, plus the sweep's 0.25 s grain
    assert service.store.channel_count == 0
    assert not [c for c in clock.getDelayedCalls() if c.active()], "a timer is left armed"


def test_each_pulled_channel_expires_one_ttl_after_it_was_named() -> None:
    service, clock = make_service(channel_ttl=2)
    pull(service, "early")
    clock.advance(1)
    pull(service, "late")  # created one second later: expires one second later
    clock.advance(1.3)
    assert set(service.store.channel_names()) == {"late"}
    clock.advance(1)
    assert service.store.channel_count == 0


def test_a_message_past_its_ttl_is_never_served_though_the_sweep_is_not_due_yet() -> None:
    clock = Clock()
    clock.advance(START)
    store = Store(Retention(4 * S, 3600 * S, 1000, 10**9), Origin("me", 0))
    service = Service(store, clock, max_timeout=120)
    clock.advance(0.1)  # its ttl ends mid-way through the sweep's 0.25 s grain
    [m] = service.publish([Draft(("c",), b"1")])
    clock.advance(3.9)
    assert [x.id for x in pull(service, "c").result.messages] == [m.id]  # 3.9 s old: kept
    clock.advance(0.2)  # past its ttl; the sweep's timer is armed for later
    assert [c for c in clock.getDelayedCalls() if c.active()]
    answer = pull(service, "c")
    assert answer.result.messages == () and answer.result.gap is True
    assert store.message_count == 0
