"""pushup/backplane/redis/client.py against a real redis-server on the real reactor (no doubles).

Each test gets its own redis-server (the ``redis_server`` fixture) and connections
made by ``connect``, which are stopped at teardown; the reactor must then have no
timers left (no reconnect or timeout outlives its connection).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from twisted.internet import defer

from deploy.redis_server import RedisServer, RedisServerError
from pushup.backplane.redis.client import (
    RedisConnection,
    RedisError,
    RedisGone,
    RedisNotSent,
    RedisTimeout,
    script_sha,
)
from pushup.config import RedisURL, parse_url
from tests.real_reactor import failure_of, reactor, run_until, wait_for

INCR_BY = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


@pytest.fixture
def connect() -> Iterator[Callable[..., RedisConnection]]:
    """``connect(url, wait=True)``: a started RedisConnection, up unless ``wait=False``."""
    made: list[RedisConnection] = []

    def make(url: str, wait: bool = True) -> RedisConnection:
        connection = RedisConnection(url, reactor)
        made.append(connection)
        connection.start()
        if wait:
            run_until(lambda: connection.connected, 5.0, f"a connection to {url}")
        return connection

    yield make
    for connection in made:
        wait_for(connection.stop())
    reactor.iterate(0)  # aborted transports close on the next turn
    assert not reactor.getDelayedCalls(), reactor.getDelayedCalls()


def commands_called(server: RedisServer, name: str) -> int:
    """How many times Redis ran command ``name`` (INFO commandstats)."""
    stats = server.cli("INFO", "commandstats").decode()
    for line in stats.splitlines():
        if line.startswith(f"cmdstat_{name}:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def test_pipelined_commands_are_answered_in_order(redis_server, connect):
    redis = connect(redis_server.url)
    replies = [redis.execute("INCR", "counter") for _ in range(500)]
    replies += [redis.execute("ECHO", value) for value in (b"bytes", "str", 7, 1.5)]
    assert all(not d.called for d in replies)  # all 504 were in flight at once
    assert wait_for(defer.gatherResults(replies)) == [*range(1, 501), b"bytes", b"str",
                                                      b"7", b"1.5"]


def test_a_reply_split_across_many_reads_is_reassembled(redis_server, connect):
    redis = connect(redis_server.url)
    big = bytes(range(256)) * 16384  # 4 MiB: many recv() calls
    replies = [redis.execute("SET", "big", big), redis.execute("GET", "big"),
               redis.execute("MGET", "big", "none", "big")]
    assert wait_for(defer.gatherResults(replies)) == [b"OK", big, [big, None, big]]


def test_an_error_reply_fails_that_command_only_and_the_connection_keeps_working(
        redis_server, connect):
    redis = connect(redis_server.url)
    first = redis.execute("SET", "k", "not a number")
    wrong = redis.execute("INCR", "k")
    after = redis.execute("GET", "k")
    assert wait_for(first) == b"OK"
    error = failure_of(wrong)
    assert isinstance(error, RedisError) and error.message.startswith("ERR value is not")
    assert wait_for(after) == b"not a number"
    assert redis.connected and wait_for(redis.execute("PING")) == b"PONG"


def test_an_error_inside_an_array_reply_is_a_value_in_the_list(redis_server, connect):
    redis = connect(redis_server.url)
    replies = [redis.execute(*command) for command in
               (("SET", "k", "text"), ("MULTI",), ("INCR", "k"), ("ECHO", "x"), ("EXEC",))]
    exec_reply = wait_for(defer.gatherResults(replies))[-1]
    assert isinstance(exec_reply[0], RedisError) and exec_reply[1] == b"x"


def test_a_bad_argument_raises_at_once_and_sends_nothing(redis_server, connect):
    redis = connect(redis_server.url)
    with pytest.raises(TypeError):
        redis.execute("SET", "k", None)
    with pytest.raises(TypeError):
        redis.execute("SET", "k", True)
    assert wait_for(redis.execute("EXISTS", "k")) == 0


def test_the_db_in_the_url_is_selected_on_connect(redis_server, connect):
    redis = connect(redis_server.url + "/3")
    assert wait_for(redis.execute("SET", "k", "in three")) == b"OK"
    assert redis_server.cli("GET", "k", db=3) == b"in three"
    assert redis_server.cli("GET", "k") is None


def test_a_unix_socket_url_with_a_db_works(redis_server, connect):
    redis = connect(f"unix://{redis_server.unix_path}?db=2")
    assert wait_for(redis.execute("SET", "k", "v")) == b"OK"
    assert redis_server.cli("GET", "k", db=2) == b"v"


def test_the_password_in_the_url_is_sent_with_auth_before_select(connect):
    server = RedisServer("--requirepass", "s3cret")
    server.start()
    try:
        redis = connect(f"redis://:s3cret@127.0.0.1:{server.port}/1")
        assert wait_for(redis.execute("SET", "k", "v")) == b"OK"
        wrong = connect(f"redis://:nope@127.0.0.1:{server.port}", wait=False)
        run_until(lambda: wrong._delay >= 0.4, 5.0, "two refused attempts")
        assert not wrong.connected
        assert isinstance(failure_of(wrong.execute("PING")), RedisGone)
    finally:
        server.stop()


def test_evalsha_falls_back_to_eval_when_redis_lacks_the_script(redis_server, connect):
    redis = connect(redis_server.url)
    sha = script_sha(INCR_BY)
    assert wait_for(redis.evalsha(sha, INCR_BY, ["n"], [5])) == 5  # first use: EVAL
    assert wait_for(redis.evalsha(sha, INCR_BY, ["n"], [5])) == 10  # cached: EVALSHA
    assert commands_called(redis_server, "eval") == 1
    redis_server.cli("SCRIPT", "FLUSH")
    assert wait_for(redis.evalsha(sha, INCR_BY, ["n"], [1])) == 11
    assert commands_called(redis_server, "eval") == 2


def test_evalsha_passes_other_script_errors_through(redis_server, connect):
    redis = connect(redis_server.url)
    script = "return redis.error_reply('MINE broken')"
    error = failure_of(redis.evalsha(script_sha(script), script, [], []))
    assert isinstance(error, RedisError) and error.message == "MINE broken"


def test_a_killed_server_fails_waiting_commands_and_the_client_reconnects_after_restart(
        redis_server, connect):
    redis = connect(redis_server.url)
    events: list[str] = []
    redis.on_connect.append(lambda: events.append("connect"))
    redis.on_lost.append(lambda: events.append("lost"))
    blocked = redis.execute("BLPOP", "nothing", 0)  # would wait forever
    run_until(lambda: b"blocked_clients:1" in redis_server.cli("INFO", "clients"), 5.0,
              "the BLPOP to block in Redis")

    redis_server.kill()
    error = failure_of(blocked)
    assert isinstance(error, RedisGone) and not isinstance(error, RedisTimeout)
    assert not isinstance(error, RedisNotSent)  # it was sent: it may have run
    assert not redis.connected and events == ["lost"]
    while_down = redis.execute("PING")
    assert while_down.called  # failed at once, not queued
    assert isinstance(failure_of(while_down), RedisNotSent)  # never sent: cannot have run

    redis_server.restart()
    run_until(lambda: redis.connected, 5.0, "the reconnect")
    assert events == ["lost", "connect"]
    assert wait_for(redis.execute("SET", "k", "v")) == b"OK"


def test_scripts_are_loaded_again_on_reconnect_so_evalsha_does_not_fall_back(
        redis_server, connect):
    redis = connect(redis_server.url)
    sha = script_sha(INCR_BY)
    assert wait_for(redis.evalsha(sha, INCR_BY, ["n"], [2])) == 2
    redis_server.kill()
    run_until(lambda: not redis.connected, 5.0, "the loss")
    redis_server.restart()  # empty: no keys, no scripts
    run_until(lambda: redis.connected, 5.0, "the reconnect")
    assert wait_for(redis.evalsha(sha, INCR_BY, ["n"], [2])) == 2
    assert commands_called(redis_server, "eval") == 0


def test_a_timeout_on_a_paused_server_fails_with_redis_timeout_and_drops_the_connection(
        redis_server, connect):
    redis = connect(redis_server.url)
    lost: list[bool] = []
    redis.on_lost.append(lambda: lost.append(True))
    redis_server.pause()
    untimed = redis.execute("GET", "k")
    started = time.monotonic()
    error = failure_of(redis.execute("PING", timeout=0.5))
    assert isinstance(error, RedisTimeout) and "PING within 0.5 s" in str(error)
    assert 0.45 <= time.monotonic() - started < 2.0
    dropped = failure_of(untimed)
    assert isinstance(dropped, RedisGone)  # same connection, dropped
    assert not isinstance(dropped, RedisNotSent)  # it was sent: it may have run
    assert lost == [True] and not redis.connected

    redis_server.resume()
    run_until(lambda: redis.connected, 5.0, "the reconnect")
    assert wait_for(redis.execute("PING", timeout=0.5)) == b"PONG"


def test_a_blocking_command_waits_as_long_as_redis_does(redis_server, connect):
    redis = connect(redis_server.url)
    popped = redis.execute("BLPOP", "queue", 0)
    assert not reactor.getDelayedCalls()  # no client-side timer on it
    reactor.callLater(1.0, redis_server.cli, "LPUSH", "queue", "late")
    assert wait_for(popped, 5.0) == [b"queue", b"late"]


def test_stop_ends_reconnecting_even_while_the_server_is_down(redis_server, connect):
    redis = connect(redis_server.url)
    redis_server.kill()
    run_until(lambda: not redis.connected and redis._retry is not None, 5.0, "a retry")
    wait_for(redis.stop())
    assert not reactor.getDelayedCalls()
    redis_server.restart()
    reactor.iterate(0.2)
    assert not redis.connected


def test_execute_before_start_fails_fast(redis_server):
    redis = RedisConnection(redis_server.url, reactor)
    assert isinstance(failure_of(redis.execute("PING")), RedisGone)


@pytest.mark.parametrize(("text", "expected"), [
    ("redis://127.0.0.1:6390", RedisURL("127.0.0.1", 6390)),
    ("redis://127.0.0.1:6390/4", RedisURL("127.0.0.1", 6390, db=4)),
    ("redis://redis.internal", RedisURL("redis.internal", 6379)),
    ("redis://[::1]:7000/", RedisURL("::1", 7000)),
    ("redis://:p%40ss@10.0.0.2:6379/1", RedisURL("10.0.0.2", 6379, db=1, password="p@ss")),
    ("redis://alice:pw@host/0", RedisURL("host", 6379, username="alice", password="pw")),
    ("unix:///run/redis.sock", RedisURL(path="/run/redis.sock")),
    ("unix:///run/redis.sock?db=3&password=x", RedisURL(path="/run/redis.sock", db=3,
                                                        password="x")),
])
def test_parse_url_accepts(text: str, expected: RedisURL) -> None:
    assert parse_url(text) == expected


@pytest.mark.parametrize("text", [
    "", "127.0.0.1:6379", "http://127.0.0.1:6379", "rediss://host:6379", "redis://",
    "redis://:6379", "redis://host:99999", "redis://host:port", "redis://host/x",
    "redis://host/-1", "redis://host/1/2", "redis://host?db=1", "redis://host#x",
    "unix://relative/path", "unix://", "unix:///sock?db=x", "unix:///sock?timeout=1",
])
def test_parse_url_rejects_with_a_one_line_message(text: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_url(text)
    assert "\n" not in str(raised.value) and "bad Redis URL" in str(raised.value)


def test_parse_url_errors_and_str_never_show_the_password() -> None:
    with pytest.raises(ValueError) as raised:
        parse_url("redis://:hunter2@host/x")
    assert "hunter2" not in str(raised.value)
    url = parse_url("redis://:hunter2@host/2")
    assert "hunter2" not in str(url) + repr(url) and str(url) == "redis://host:6379/2"


def test_a_temporary_directory_too_long_for_a_socket_says_so(tmp_path, monkeypatch):
    long = tmp_path / ("d" * 100)
    long.mkdir()
    monkeypatch.setenv("TMPDIR", str(long))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    server = RedisServer()
    with pytest.raises(RedisServerError, match="longer than 107 bytes: set a shorter TMPDIR"):
        server.start()
    server.stop()
