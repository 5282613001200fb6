"""Idempotent publish (``Idempotency-Key``) on one node, as bytes through the
HTTP front, and the mesh's carrying of keys between nodes, in memory.

Real processes (another node of a mesh, Redis frozen, a data dir after
SIGKILL) are in tests/cluster/test_idempotency.py and tests/e2e.
"""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet.task import Clock

from pushup.backplane.mesh.mesh import Mesh
from pushup.backplane.mesh.wire import (
    backlog,
    decode_snapshot,
    export_snapshot,
    pack_batch,
    unpack_batch,
)
from pushup.config import Config
from pushup.core.idempotency import Idem, Replayed
from pushup.core.model import Draft, Origin
from pushup.core.service import Service
from pushup.core.store import Retention, Store

S = 1_000_000


def keyed(h: Any, key: str, data: Any = 1, channels: tuple[str, ...] = ("a",)) -> Any:
    return h.publish(list(channels), data, headers={"Idempotency-Key": key})


def stored(h: Any, channel: str = "a") -> list[Any]:
    return h.subscribe(channel, since=0, timeout=0).response.json["messages"]  # type: ignore[no-any-return]


def test_a_retry_with_the_same_key_stores_nothing_and_gets_the_first_answer(node):
    first = keyed(node, "order-17", {"total": 3})
    node.clock.advance(5)
    again = keyed(node, "order-17", {"total": 3})
    assert first.status == again.status == 201
    assert again.json == first.json  # the same id, timestamp and channels
    assert [m["id"] for m in stored(node)] == [first.json["id"]]
    assert node.stats()["published"] == 1
    other = keyed(node, "order-18", {"total": 3})  # another key: another publish
    assert other.json["id"] != first.json["id"] and len(stored(node)) == 2


def test_a_batch_retry_gets_every_first_receipt(node):
    body = {"messages": [{"channels": ["a"], "data": i} for i in range(3)]}
    first = node.post("/publish", body, headers={"Idempotency-Key": "b1"})
    again = node.post("/publish", body, headers={"Idempotency-Key": "b1"})
    assert first.status == again.status == 201 and again.json == first.json
    assert [m["data"] for m in stored(node)] == [0, 1, 2]


def test_a_20000_message_batch_retry_is_byte_identical_and_its_record_is_counted(node):
    body = {"messages": [{"channels": ["a", "b"] if i % 2 else ["a"], "data": i}
                         for i in range(20_000)]}
    assert node.stats()["idempotency_keys"] == 0
    first = node.post("/publish", body, headers={"Idempotency-Key": "big"})
    node.clock.advance(5)
    again = node.post("/publish", body, headers={"Idempotency-Key": "big"})
    assert first.status == again.status == 201
    assert again.body == first.body and len(first.json["messages"]) == 20_000
    stats = node.stats()
    assert stats["published"] == 20_000
    assert stats["idempotency_keys"] == 1
    record = node.service.store.keys.records()[0]
    assert len(record.runs) == 1 and stats["idempotency_bytes"] == record.size < 1000
    metrics = node.get("/metrics").body.decode()
    assert "\npushup_idempotency_keys 1.0\n" in metrics
    assert f"\npushup_idempotency_bytes {record.size}.0\n" in metrics


def test_the_same_key_with_another_body_is_refused_422_and_stores_nothing(node, check_error):
    keyed(node, "k", 1)
    check_error(keyed(node, "k", 2), 422, "idempotency_key_reused")
    check_error(keyed(node, "k", 1, channels=("a", "b")), 422, "idempotency_key_reused")
    assert [m["data"] for m in stored(node)] == [1]


@pytest.mark.parametrize("key", ["", "x" * 129, "caf\u00e9", "tab\there"])
def test_a_bad_key_is_400_and_stores_nothing(node, check_error, key):
    response = node.post("/publish", {"channels": ["a"], "data": 1},
                         headers={"Idempotency-Key": key})
    check_error(response, 400, "bad_idempotency_key")
    assert stored(node) == []


def test_two_key_lines_are_400_not_one_joined_key(node, check_error):
    body = b'{"channels":["a"],"data":1}'
    conn = node.connect()
    conn.send(b"POST /publish HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\n"
              b"Idempotency-Key: k2\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    check_error(conn.response, 400, "bad_idempotency_key")
    assert conn.lost  # nothing after it is read
    assert stored(node) == []
    # a single line with that joined value is a key like any other
    assert keyed(node, "k1, k2").status == 201


def test_a_key_of_128_printable_characters_is_accepted(node):
    key = "".join(chr(0x21 + i % 94) for i in range(128))
    assert keyed(node, key).status == 201 and keyed(node, key).status == 201
    assert len(stored(node)) == 1


def test_a_key_is_forgotten_after_the_window(make_node):
    h = make_node(idempotency_window=60)
    first = keyed(h, "k")
    h.clock.advance(59)
    assert keyed(h, "k").json["id"] == first.json["id"]
    h.clock.advance(1)
    later = keyed(h, "k", 2)  # the window is over: a new publish, even with another body
    assert later.status == 201 and later.json["id"] != first.json["id"]


def test_a_browser_may_send_the_key_across_origins(make_node):
    h = make_node(cors_origin=("*",))
    allowed = h.request("OPTIONS", "/publish").header("access-control-allow-headers")
    assert "idempotency-key" in allowed.lower()


# -- the mesh: the key travels with its message ---------------------------------

def mesh_node(name: str) -> Mesh:
    clock = Clock()
    clock.advance(1_700_000_000)
    store = Store(Retention(3600 * S, 3600 * S, 100, 10**9), Origin(name, 1_700_000_000 * S))
    return Mesh(Service(store, clock, 120), Config(cluster_secret="s"), clock, http=None)


def test_a_peer_that_received_a_keyed_publish_answers_its_retry_without_storing():
    a, b = mesh_node("a"), mesh_node("b")
    drafts = [Draft(("c",), b"1"), Draft(("c",), b"2")]
    idem = Idem("k", "f")
    first = a.service.publish(drafts, idem)
    store = a.store
    batch = unpack_batch(pack_batch(backlog(store, store.origin_name, 0,
                                              (store.own_seq, store.last_ts))))
    b.receive(batch)
    retried = b.publish(drafts, idem)
    answer = retried.result
    assert isinstance(answer, Replayed)
    assert [(m.id, m.ts) for m in answer] == [(m.id, m.ts) for m in first]
    assert b.store.message_count == 2 and b.store.own_seq == 0  # nothing stored again


def test_a_node_that_joins_later_knows_the_keys_from_its_snapshot():
    old, new = mesh_node("a"), mesh_node("b")
    first = old.service.publish([Draft(("c",), b"1")], Idem("k", "f"))
    new.store.load(decode_snapshot(export_snapshot(old.store)), new.service.now())
    again = new.service.publish([Draft(("c",), b"1")], Idem("k", "f"))
    assert isinstance(again, Replayed) and again[0].id == first[0].id
