"""The data directory: what a node acknowledged survives a crash and a restart."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from twisted.internet.task import Clock

from pushup.backplane.disk import DataDir, DataDirError
from pushup.core.model import Draft

START = 1_763_800_000.0


@pytest.fixture
def boot(make_node: Callable[..., Any]) -> Callable[..., Any]:
    """``boot(path, at=START, **config)``: a node on data dir ``path`` whose
    clock reads ``at``, started (its data read back)."""
    def start(path: Path, at: float = START, **settings: Any) -> Any:
        clock = Clock()
        clock.advance(at)
        h = make_node(clock=clock, data_dir=str(path), **settings)
        h.node.start()
        return h
    return start


def crash(h: Any) -> None:
    """The process dies: nothing more is written (its clock is dropped), the lock goes."""
    assert h.node.data is not None
    h.node.data.close()


def rows(path: Path, table: str) -> int:
    with sqlite3.connect(path / "pushup.sqlite3") as db:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_a_publish_is_acknowledged_only_once_its_transaction_committed(boot, tmp_path):
    h = boot(tmp_path)
    acked = h.node.backplane.publish([Draft(("a",), b"1")])
    assert not acked.called and rows(tmp_path, "messages") == 0
    h.clock.advance(0)  # the end of the reactor turn: one transaction
    assert acked.called and rows(tmp_path, "messages") == 1


def test_a_publish_the_disk_refuses_is_answered_202_and_written_when_it_can(
        boot, tmp_path, monkeypatch):
    h = boot(tmp_path)
    real = DataDir.write

    def full(self, *args):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(DataDir, "write", full)
    conn = h.open("POST", "/publish", {"channels": ["a"], "data": 1})
    # Published (its subscribers have it) but not durable: not a 201, not a 5xx.
    assert conn.response.status == 202 and conn.response.json["id"].endswith("-1")
    assert rows(tmp_path, "messages") == 0
    monkeypatch.setattr(DataDir, "write", real)
    h.clock.advance(1.0)  # the write is tried again
    assert rows(tmp_path, "messages") == 1


def test_the_publishes_of_one_turn_share_one_transaction(boot, tmp_path, monkeypatch):
    h = boot(tmp_path)
    writes = []
    real = DataDir.write
    monkeypatch.setattr(DataDir, "write", lambda self, *a: (writes.append(1), real(self, *a)))
    acks = [h.node.backplane.publish([Draft(("a",), b"%d" % i)]) for i in range(20)]
    h.clock.advance(0)
    assert all(d.called for d in acks) and len(writes) == 1
    assert rows(tmp_path, "messages") == 20


def test_acknowledged_messages_and_channels_survive_a_crash_with_their_ids(boot, tmp_path):
    h = boot(tmp_path)
    assert h.post("/channels", {"name": "kept", "ttl": 7200}).status == 201
    ids = [h.publish("a", i).json["id"] for i in range(5)]
    cursor = h.subscribe("a", since=0, limit=2, timeout=0).response.json["cursor"]
    node_id = h.stats()["node_id"]
    crash(h)
    again = boot(tmp_path, at=h.clock.seconds() + 1)
    assert again.stats()["node_id"] == node_id
    assert again.stats()["origin"] != h.stats()["origin"]  # a new epoch
    body = again.subscribe("a", since=0, timeout=0).response.json
    assert [m["id"] for m in body["messages"]] == ids and not body.get("gap")
    rest = again.subscribe("a", since=cursor, timeout=0).response.json
    assert [m["id"] for m in rest["messages"]] == ids[2:] and not rest.get("gap")
    assert again.get("/channels/kept").json["expires_at"] == pytest.approx(START + 7200)


def test_a_restart_applies_retention_as_of_now_and_reports_the_gap(boot, tmp_path):
    h = boot(tmp_path, message_ttl=60)
    h.publish("a", 1)
    cursor = h.subscribe("a", since=0, timeout=0).response.json["cursor"]
    h.publish("a", 2)  # never read, and it expires while the node is down
    crash(h)
    again = boot(tmp_path, at=START + 120, message_ttl=60)
    assert again.stats()["messages"] == 0 and rows(tmp_path, "messages") == 0
    first = again.subscribe("a", since=cursor, timeout=0).response.json
    assert first["gap"] is True and first["messages"] == []
    assert not again.subscribe("a", since=first["cursor"], timeout=0).response.json.get("gap")


def test_evicted_messages_leave_the_disk_and_deleted_channels_stay_deleted(boot, tmp_path):
    h = boot(tmp_path, max_messages_per_channel=3)
    for i in range(10):
        h.publish(["a", "b"], i)
    assert rows(tmp_path, "messages") == 3
    assert h.request("DELETE", "/channels/a").status == 204
    assert rows(tmp_path, "messages") == 3  # still on b
    crash(h)
    again = boot(tmp_path, at=START + 1, max_messages_per_channel=3)
    assert again.get("/channels/a").status == 404
    assert len(again.subscribe("b", since=0, timeout=0).response.json["messages"]) == 3


def test_only_one_process_may_use_a_data_dir(tmp_path):
    first = DataDir(str(tmp_path))
    with pytest.raises(DataDirError, match="in use"):
        DataDir(str(tmp_path))
    first.close()
    DataDir(str(tmp_path)).close()


def test_a_new_epoch_supersedes_the_old_even_if_the_clock_went_back(tmp_path):
    data = DataDir(str(tmp_path))
    first = data.begin("n1", 2_000_000_000_000)
    assert data.begin("n1", 1_000_000_000_000) // 1000 == first // 1000 + 1
    data.close()


def test_fifty_restarts_with_a_data_dir_keep_the_cursor_short_and_exact(boot, tmp_path):
    at, cursor, seen = START, None, []
    for k in range(50):
        h = boot(tmp_path, at=at, message_ttl=60)
        sent = h.publish("a", k).json["id"]
        body = h.subscribe("a", since=cursor or 0, timeout=0).response.json
        assert not body.get("gap")
        seen += [m["id"] for m in body["messages"]]
        assert [m["id"] for m in body["messages"]][-1] == sent
        cursor = body["cursor"]
        assert len(h.node.service.store.end().positions) <= 2
        from pushup.core.cursor import decode
        assert len(decode(cursor).positions) <= 2
        crash(h)
        at += 61  # what it held expires while it is down
    assert len(seen) == len(set(seen)) == 50


def test_a_restart_remembers_the_idempotency_keys_of_its_publishes(boot, tmp_path):
    h = boot(tmp_path)
    key = {"Idempotency-Key": "order-5"}
    first = h.publish("a", 1, headers=key)
    h.clock.advance(0)  # written, with its key
    crash(h)
    again = boot(tmp_path, at=h.clock.seconds() + 1)
    retried = again.publish("a", 1, headers=key)
    assert retried.status == 201 and retried.json == first.json
    assert again.publish("a", 2, headers=key).status == 422  # the key is taken
    body = again.subscribe("a", since=0, timeout=0).response.json
    assert [m["id"] for m in body["messages"]] == [first.json["id"]]
