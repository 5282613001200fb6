"""Process lifecycle: startup line, SIGTERM/SIGINT drain, exit-2 configs, precedence, stats."""
from __future__ import annotations

import http.client
import re
import signal
import socket
import time

import pytest

from tests.e2e.support import (
    assert_error,
    assert_json_ok,
    free_port,
    run_cli,
    spawn,
    stop,
    uniq,
)


def test_first_stdout_line_and_logs_on_stderr(start_node):
    n = start_node("--log-level", "debug")
    assert n.stdout_lines[0] == f"listening on http://127.0.0.1:{n.port}"
    assert_json_ok(n.get("/health"))
    n.alive_check()
    n.get("/nope")
    assert stop(n) == 0
    assert n.stdout_lines == [f"listening on http://127.0.0.1:{n.port}"]  # logs go to stderr


@pytest.mark.parametrize("level", ["warn", "error", "info"])
def test_log_levels_start(start_node, level):
    start_node("--log-level", level).alive_check()


def test_explicit_port(start_node):
    port = free_port()
    n = spawn(port=str(port))
    try:
        assert n.port == port
        n.alive_check()
    finally:
        assert stop(n) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_signal_drains_and_exits_0(sig):
    n = spawn()
    try:
        chans = [uniq("drain") for _ in range(3)]
        curs = [n.subscribe([c])["cursor"] for c in chans]
        polls = [n.subscribe_async([c], since=cur, timeout=100)
                 for c, cur in zip(chans, curs, strict=True)]
        n.wait_stat("waiting", lambda w: w == 3)
        keep = n.conn(timeout=5)
        assert_json_ok(n.request("GET", "/health", conn=keep))
        t0 = time.monotonic()
        n.proc.send_signal(sig)
        for p in polls:
            body = assert_json_ok(p.result(10))
            assert body["messages"] == []
            assert isinstance(body["cursor"], str) and body["cursor"]
        # a new connection now: refused (listener closed) or 503 shutting_down, never 200
        try:
            r = n.get("/health", timeout=5)
        except OSError:
            pass
        else:
            assert_error(r, 503, "shutting_down")
        # /health on a connection opened before: 503 shutting_down, or the connection closed
        try:
            r = n.request("GET", "/health", conn=keep)
            assert_error(r, 503, "shutting_down")
        except (http.client.HTTPException, ConnectionError, OSError):
            pass
        finally:
            keep.close()
        rc = n.proc.wait(10)
        assert rc == 0, n.stderr_lines[-10:]
        assert time.monotonic() - t0 < 10
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", n.port), timeout=2).close()
    finally:
        if n.proc.poll() is None:
            n.proc.kill()
            n.proc.wait(5)


# ---- refusing to start -----------------------------------------------------------------

def assert_exit_2(cp):
    assert cp.returncode == 2, (cp.returncode, cp.stderr[-500:])
    lines = [ln for ln in cp.stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert b"listening on" not in cp.stdout


@pytest.mark.parametrize("args", [
    ["--peer", "http://127.0.0.1:1"],
    ["--bogus-flag"],
    ["--port", "abc"],
    ["--port", "99999"],
    ["--message-ttl", "soon"],
    ["--channel-ttl", "-5"],
    ["--max-timeout", "x"],
    ["--max-connections", "0"],
    ["--max-limit", "1.5"],
    ["--reactor", "kqueue-nope"],
    ["--workers", "0"],
    ["--host", "0.0.0.0"],
    ["--log-level", "loud"],
    ["--config", "/nonexistent/pushup.toml"],
], ids=lambda a: " ".join(a))
def test_invalid_configuration_exits_2(args):
    assert_exit_2(run_cli("serve", "--port", "0", *args))


def test_unknown_subcommand_exits_2():
    cp = run_cli("frobnicate")
    assert cp.returncode == 2


@pytest.mark.parametrize("env", [
    {"PUSHUP_PEER": "http://127.0.0.1:1"},
    {"PUSHUP_MESSAGE_TTL": "abc"},
    {"PUSHUP_ALLOW_OPEN_PUBLISH": "maybe"},
    {"PUSHUP_HOST": "0.0.0.0"},
    {"PUSHUP_HOST": "0.0.0.0", "PUSHUP_ALLOW_OPEN_PUBLISH": "no"},
], ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_invalid_env_configuration_exits_2(env):
    assert_exit_2(run_cli("serve", "--port", "0", env=env))


@pytest.mark.parametrize("toml", [
    'publish_token = "unterminated',
    "this is not toml",
    'no_such_key = 1',
    'message_ttl = "soon"',
    'peer = ["http://127.0.0.1:1"]',
    'host = "0.0.0.0"',
    'max_limit = "many"',
], ids=range(7))
def test_invalid_toml_exits_2(tmp_path, toml):
    cfg = tmp_path / "pushup.toml"
    cfg.write_text(toml + "\n")
    assert_exit_2(run_cli("serve", "--port", "0", "--config", str(cfg)))


def test_non_loopback_checks_token_from_any_source(tmp_path):
    # the refusal is about the effective configuration, whatever its source
    cfg = tmp_path / "c.toml"
    cfg.write_text('host = "0.0.0.0"\nallow_open_publish = false\n')
    assert_exit_2(run_cli("serve", "--port", "0", "--config", str(cfg)))


# ---- precedence -------------------------------------------------------------------------

def publish_status(n, token):
    return n.publish_raw([uniq("prec")], 1, token=token).status


def test_token_from_env(start_node):
    n = start_node(env={"PUSHUP_PUBLISH_TOKEN": "x"})
    assert publish_status(n, "") == 401
    assert publish_status(n, "y") == 401
    assert publish_status(n, "x") == 201


def test_token_from_toml(start_node, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('publish_token = "fromfile"\n')
    n = start_node("--config", str(cfg))
    assert publish_status(n, "") == 401
    assert publish_status(n, "fromfile") == 201


def test_env_beats_toml(start_node, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('publish_token = "fromfile"\nnode_id = "file-node"\n')
    n = start_node("--config", str(cfg), env={"PUSHUP_PUBLISH_TOKEN": "fromenv",
                                              "PUSHUP_NODE_ID": "env-node"})
    assert publish_status(n, "fromfile") == 401
    assert publish_status(n, "fromenv") == 201
    assert n.stats()["node_id"] == "env-node"


def test_flag_beats_env_and_toml(start_node, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('publish_token = "fromfile"\nnode_id = "file-node"\n')
    n = start_node("--config", str(cfg), "--publish-token", "fromflag", "--node-id", "flag-node",
                   env={"PUSHUP_PUBLISH_TOKEN": "fromenv", "PUSHUP_NODE_ID": "env-node"})
    assert publish_status(n, "fromfile") == 401
    assert publish_status(n, "fromenv") == 401
    assert publish_status(n, "fromflag") == 201
    assert n.stats()["node_id"] == "flag-node"


def test_toml_values_apply(start_node, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('cors_origin = "https://toml.example"\nmax_timeout = 1\n'
                   'max_messages_per_channel = 2\nnode_id = "toml-node"\n')
    n = start_node("--config", str(cfg))
    r = n.subscribe_raw([uniq()], timeout=0)
    assert r.header("Access-Control-Allow-Origin") == "https://toml.example"
    assert n.stats()["node_id"] == "toml-node"
    ch = uniq("t")
    for i in range(3):
        n.publish([ch], i)
    body = n.subscribe([ch], since="0")
    assert [m["data"] for m in body["messages"]] == [1, 2] and body.get("gap") is True
    # max_timeout = 1 caps a 100 s poll: it is answered, empty, by its (capped) timeout
    body = n.subscribe_guarded([uniq()], "timeout=100 capped to max_timeout = 1 s",
                               timeout=100)
    assert body["messages"] == [] and body.get("gap", False) is False


@pytest.mark.parametrize("value", ["1", "true", "yes", "0", "false", "no"])
def test_env_values_apply(start_node, value):
    n = start_node(env={"PUSHUP_CORS_ORIGIN": "https://env.example", "PUSHUP_MAX_LIMIT": "2",
                        "PUSHUP_ALLOW_OPEN_PUBLISH": value})
    r = n.subscribe_raw([uniq()], timeout=0)
    assert r.header("Access-Control-Allow-Origin") == "https://env.example"
    ch = uniq("e")
    for i in range(3):
        n.publish([ch], i)
    assert len(n.subscribe([ch], since="0", limit=10)["messages"]) == 2


def test_node_id_flag(start_node):
    n = start_node("--node-id", "alpha-1")
    assert n.stats()["node_id"] == "alpha-1"


# ---- /stats and /metrics ----------------------------------------------------------------

STATS_KEYS = {"node_id", "uptime_s", "connections", "waiting", "channels", "messages",
              "published", "delivered", "bytes_in", "bytes_out", "rss_bytes", "peers"}


def test_stats_keys_and_counters(start_node):
    n = start_node()
    s0 = n.stats()
    assert STATS_KEYS <= set(s0), STATS_KEYS - set(s0)
    assert s0["peers"] == []
    assert isinstance(s0["node_id"], str) and s0["node_id"]
    for k in STATS_KEYS - {"node_id", "peers"}:
        assert isinstance(s0[k], int | float) and s0[k] >= 0, (k, s0[k])
    assert s0["rss_bytes"] > 1_000_000
    assert s0["published"] == 0 and s0["delivered"] == 0 and s0["messages"] == 0
    assert s0["waiting"] == 0 and s0["channels"] == 0
    a, b, c = uniq("a"), uniq("b"), uniq("c")
    n.publish([a, b, c], "x" * 10000)           # one message on three channels
    s1 = n.stats()
    assert s1["published"] == 1 and s1["messages"] == 1 and s1["channels"] == 3
    assert s1["bytes_in"] - s0["bytes_in"] >= 10000
    assert s1["bytes_out"] > s0["bytes_out"]
    n.publish_batch([{"channels": [a], "data": 1}, {"channels": [b], "data": 2}])
    s2 = n.stats()
    assert s2["published"] == 3 and s2["messages"] == 3
    # delivered counts per subscriber
    n.subscribe([a, b], since="0")               # 3 messages to one subscriber
    n.subscribe([c], since="0")                  # 1 message
    s3 = n.stats()
    assert s3["delivered"] == 4
    assert s3["bytes_out"] - s2["bytes_out"] >= 20000
    # waiting and connections
    cur = n.subscribe([a])["cursor"]
    polls = [n.subscribe_async([a], since=cur, timeout=60) for _ in range(2)]
    s4 = n.wait_stat("waiting", lambda w: w == 2)
    assert s4["connections"] >= 3
    pub = n.publish([a], "wake")
    for p in polls:
        assert [m["id"] for m in assert_json_ok(p.result(10))["messages"]] == [pub["id"]]
    s5 = n.wait_stat("waiting", lambda w: w == 0)
    assert s5["delivered"] == 4 + 2 + 2  # the since=0 poll on a got 2, then 2 wakes
    assert s5["uptime_s"] >= s0["uptime_s"]


def test_stats_connections_counts_open_sockets(start_node):
    n = start_node()
    base = n.stats()["connections"]
    socks = [socket.create_connection(("127.0.0.1", n.port), timeout=5) for _ in range(7)]
    try:
        n.wait_stat("connections", lambda c: c >= base + 7)
    finally:
        for s in socks:
            s.close()
    n.wait_stat("connections", lambda c: c <= base)


def metric_value(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+(\S+)", text, re.M)
    assert m, f"{name} missing from /metrics"
    return float(m.group(1))


def test_metrics(start_node):
    n = start_node()
    ch = uniq("m")
    n.publish([ch, uniq("m2")], 1)
    n.publish([ch], 2)
    cur = n.subscribe([ch], since="0")["cursor"]
    p = n.subscribe_async([ch], since=cur, timeout=60)
    n.wait_subscribers(ch, 1)
    r = n.get("/metrics")
    assert r.status == 200
    assert (r.header("Content-Type") or "").startswith("text/plain")
    text = r.body.decode()
    assert metric_value(text, "pushup_published_total") == 2
    assert metric_value(text, "pushup_waiting") == 1
    assert metric_value(text, "process_resident_memory_bytes") > 1_000_000
    for line in text.splitlines():
        assert line.startswith("#") or re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?\s+\S+", line) \
            or not line.strip(), line
    n.publish([ch], 3)
    p.result(10)
