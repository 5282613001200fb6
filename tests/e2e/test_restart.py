"""A single node restarted, with and without --data-dir (real processes, SIGKILL)."""
from __future__ import annotations

import pytest
from pushup_e2e import free_port, run_cli, spawn, stop, uniq


@pytest.fixture
def started():
    """Nodes a test starts itself (on a port of its choosing); stopped at teardown."""
    nodes = []
    yield nodes
    codes = [stop(n) for n in nodes]
    assert all(rc in (0, -9) for rc in codes), codes  # -9: killed by the test


def kill(node) -> None:
    node.proc.kill()
    node.proc.wait(10)


def test_without_a_data_dir_a_cursor_from_before_a_crash_gets_one_gap(started):
    port = str(free_port())
    n = spawn(port=port)
    started.append(n)
    ch = uniq()
    n.publish(ch, 1)
    cursor = n.subscribe(ch, since="0")["cursor"]
    n.publish(ch, 2)  # never read: lost with the restart
    node_id = n.stats()["node_id"]
    kill(n)
    again = spawn(port=port)
    started.append(again)
    assert again.stats()["node_id"] == node_id  # HOSTNAME-PORT: the same node, a new epoch
    first = again.subscribe_guarded(ch, "a gap, answered at once", timeout=60, since=cursor)
    assert first["gap"] is True and first["messages"] == []
    second = again.subscribe(ch, since=first["cursor"], timeout=0)
    assert not second.get("gap") and second["messages"] == []
    fresh = again.publish(ch, 3)
    third = again.subscribe(ch, since=second["cursor"], timeout=0)
    assert [m["id"] for m in third["messages"]] == [fresh["id"]] and not third.get("gap")


def test_with_a_data_dir_every_acknowledged_message_survives_a_crash(started, tmp_path):
    data = str(tmp_path / "data")
    n = spawn("--data-dir", data)
    started.append(n)
    name = uniq("kept")
    assert n.post("/channels", {"name": name, "ttl": 7200}).status == 201
    ch = uniq()
    early = [n.publish(ch, i)["id"] for i in range(3)]
    before = n.subscribe(ch, since="0")["cursor"]
    r = n.publish_batch([{"channels": [ch], "data": {"i": i}} for i in range(20)])
    assert r.status == 201, r
    batch = [m["id"] for m in r.json["messages"]]
    node_id = n.stats()["node_id"]  # random (--port 0), and stored in the data dir
    kill(n)  # at once after the 201s
    again = spawn("--data-dir", data)
    started.append(again)
    assert again.stats()["node_id"] == node_id
    everything = again.subscribe(ch, since="0", limit=1000)
    assert [m["id"] for m in everything["messages"]] == early + batch
    assert [m["data"] for m in everything["messages"]][3:] == [{"i": i} for i in range(20)]
    assert not everything.get("gap")
    after = again.subscribe(ch, since=before, limit=1000)
    assert [m["id"] for m in after["messages"]] == batch and not after.get("gap")
    assert again.channel_info(name).status == 200
    fresh = again.publish(ch, "new")
    last = again.subscribe(ch, since=after["cursor"])
    assert [m["id"] for m in last["messages"]] == [fresh["id"]] and not last.get("gap")


def test_with_a_data_dir_a_retry_after_a_crash_finds_its_idempotency_key(started, tmp_path):
    data = str(tmp_path / "data")
    n = spawn("--data-dir", data)
    started.append(n)
    ch, key = uniq(), {"Idempotency-Key": uniq("key")}
    first = n.publish_raw([ch], {"n": 1}, headers=key)
    assert first.status == 201, first
    kill(n)  # at once after the 201: the publisher never saw it, say, and retries
    again = spawn("--data-dir", data)
    started.append(again)
    retried = again.publish_raw([ch], {"n": 1}, headers=key)
    assert retried.status == 201 and retried.json == first.json
    assert [m["id"] for m in again.subscribe(ch, since="0")["messages"]] == [first.json["id"]]


def test_a_data_dir_in_use_is_refused_with_exit_2(started, tmp_path):
    data = str(tmp_path / "data")
    started.append(spawn("--data-dir", data))
    second = run_cli("serve", "--port", "0", "--data-dir", data)
    assert second.returncode == 2
    assert b"in use" in second.stderr


@pytest.mark.parametrize("flags", [("--peer", "http://127.0.0.1:1", "--cluster-secret", "s"),
                                   ("--workers", "2")])
def test_a_data_dir_is_for_a_single_node(tmp_path, flags):
    r = run_cli("serve", "--port", "0", "--data-dir", str(tmp_path), *flags)
    assert r.returncode == 2 and b"--data-dir is for a single node" in r.stderr
