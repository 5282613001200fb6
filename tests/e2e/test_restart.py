"""A single node restarted, with and without --data-dir (real processes, SIGKILL)."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.e2e.support import (
    PUSHUP,
    START_TIMEOUT,
    clean_env,
    free_port,
    run_cli,
    spawn,
    stop,
    uniq,
)
from tests.toolkit import first_line


@pytest.fixture
def started():
    """Nodes a test starts itself (on a port of its choosing); stopped at teardown."""
    nodes = []
    yield nodes
    codes = [stop(n) for n in nodes]
    # -9: killed by the test; any other node drained and exited 0
    assert codes == [-9 if getattr(n, "killed", False) else 0 for n in nodes], codes


def kill(node) -> None:
    node.proc.kill()
    node.proc.wait(10)
    node.killed = True


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


def test_a_data_dir_is_for_a_single_process(tmp_path):
    r = run_cli("serve", "--port", "0", "--data-dir", str(tmp_path), "--workers", "2")
    assert r.returncode == 2
    assert b"data_dir (--data-dir, PUSHUP_DATA_DIR or data_dir in the config file) is for a " \
        b"single process" in r.stderr


# -- a data directory that cannot be used: one line, exit 2, before listening ------

DAMAGE = 40 * 1024


def fill(n, batches: int) -> None:
    ch = uniq()
    for _ in range(batches):
        r = n.publish_batch([{"channels": [ch], "data": "x" * 200} for _ in range(50)])
        assert r.status == 201, r


def start_or_refuse(data: str) -> tuple[int | None, bytes, bytes]:
    """Start a node on ``data``: (None, first stdout line, b"") if it serves
    (then it is stopped), else (exit code, stdout, stderr). Not the toolkit's
    ``ServedNode``: a refusal is what these tests wait for."""
    proc = subprocess.Popen([PUSHUP, "serve", "--port", "0", "--data-dir", data],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=clean_env())
    # the listening line, or b"" once it exited (the toolkit's read, with a deadline)
    line = first_line(proc, START_TIMEOUT).encode()
    if line.startswith(b"listening on"):
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=15)
        return None, line, b""
    out, err = proc.communicate(timeout=15)
    return proc.returncode, line + out, err


def test_a_data_dir_damaged_in_the_middle_is_refused_before_listening(started, tmp_path):
    data = str(tmp_path / "data")
    n = spawn("--data-dir", data)
    started.append(n)
    fill(n, 40)
    assert stop(n) == 0
    database = os.path.join(data, "pushup.sqlite3")
    size = os.path.getsize(database)
    assert size > 4 * DAMAGE
    with open(database, "r+b") as f:  # 40 KB overwritten in the middle
        f.seek(size // 2)
        f.write(b"\xa5" * DAMAGE)
    code, out, err = start_or_refuse(data)
    assert code == 2, (code, out, err[-2000:])
    assert out == b""  # never "listening on"
    lines = err.decode().splitlines()
    assert len(lines) == 1 and "damaged" in lines[0] and data in lines[0], lines


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs of this test's own (we are root), unmounted at teardown."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_starting_on_a_full_disk_is_one_line_and_exit_2(started, small_disk):
    data = str(small_disk / "data")
    n = spawn("--data-dir", data)
    fill(n, 3)
    kill(n)  # its write-ahead log stays, as after a crash
    filler = small_disk / "filler"
    refused = []
    # As the disk fills, the node either serves (its writes then fail, each
    # publish answered 202) or refuses to start: never a traceback.
    for free in (16, 12, 8, 4, 0):  # KiB left
        avail = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
        with open(filler, "ab") as f:
            f.write(b"\0" * max(0, avail - free * 1024))
        code, out, err = start_or_refuse(data)
        if code is None:
            continue
        assert code == 2, (free, code, err[-2000:])
        lines = err.decode().splitlines()
        assert len(lines) == 1 and "disk is full" in lines[0], (free, lines)
        refused.append(free)
    assert 0 in refused
