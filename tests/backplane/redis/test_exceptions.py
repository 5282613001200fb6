"""Redis's error replies as types: the one prefix table, what each type carries,
and that the reply parser hands every error reply over typed; one hash tag rule."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import task
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from pushup.backplane.redis import partitions, slots
from pushup.backplane.redis.client import RedisProtocol
from pushup.backplane.redis.exceptions import (
    REPLY_ERRORS,
    Ask,
    ChannelExists,
    ClusterDown,
    KeyReused,
    Loading,
    Moved,
    NoScript,
    Redirected,
    RedisError,
    ScriptRefused,
    TryAgain,
    reply_error,
)

REPLIES = [
    ("MOVED 3999 127.0.0.1:6381", Moved),
    ("ASK 3999 [::1]:6381", Ask),
    ("TRYAGAIN Multiple keys request during rehashing of slot", TryAgain),
    ("CLUSTERDOWN The cluster is down", ClusterDown),
    ("LOADING Redis is loading the dataset in memory", Loading),
    ("NOSCRIPT No matching script. Please use EVAL.", NoScript),
    ("EXISTS news", ChannelExists),
    ("REUSED the key was used for another body", KeyReused),
]


@pytest.mark.parametrize(("message", "kind"), REPLIES, ids=[m.split()[0] for m, _ in REPLIES])
def test_each_word_of_the_table_is_its_type_and_keeps_the_whole_reply(
        message: str, kind: type[RedisError]) -> None:
    error = reply_error(message)
    assert type(error) is kind and isinstance(error, RedisError)
    assert error.message == message == str(error)


def test_the_table_holds_the_words_redis_and_our_scripts_answer_with() -> None:
    assert set(REPLY_ERRORS) == {m.split()[0] for m, _ in REPLIES}


@pytest.mark.parametrize("message", ["ERR unknown command 'NOPE'", "MINE broken",
                                     "WRONGTYPE Operation against a key", "MOVEDX 1 a:1", ""])
def test_any_other_reply_is_a_plain_redis_error(message: str) -> None:
    error = reply_error(message)
    assert type(error) is RedisError and error.message == message


def test_a_redirect_says_its_slot_and_address() -> None:
    moved, ask = reply_error("MOVED 3999 127.0.0.1:6381"), reply_error("ASK 12 [::1]:7000")
    assert isinstance(moved, Redirected) and (moved.slot, moved.address) == (
        3999, "127.0.0.1:6381")
    assert isinstance(ask, Redirected) and (ask.slot, ask.address) == (12, "[::1]:7000")


def test_a_refused_create_names_its_channel() -> None:
    error = reply_error("EXISTS a channel with spaces")
    assert isinstance(error, ChannelExists) and isinstance(error, ScriptRefused)
    assert error.channel == "a channel with spaces"


def _connected() -> tuple[RedisProtocol, StringTransport]:
    protocol = RedisProtocol(task.Clock())
    transport = StringTransport()
    protocol.makeConnection(transport)
    return protocol, transport


def test_the_reply_parser_fails_a_command_with_its_typed_error() -> None:
    protocol, _ = _connected()
    failures: list[Failure] = []
    protocol.execute("GET", "k").addErrback(failures.append)
    protocol.dataReceived(b"-MOVED 866 10.0.0.2:6379\r\n")
    (failure,) = failures
    assert isinstance(failure.value, Moved) and failure.value.address == "10.0.0.2:6379"


def test_an_error_inside_an_array_is_typed_too() -> None:
    protocol, _ = _connected()
    replies: list[Any] = []
    protocol.execute("EXEC").addCallback(replies.append)
    protocol.dataReceived(b"*2\r\n-TRYAGAIN later\r\n$1\r\nx\r\n")
    (reply,) = replies
    assert isinstance(reply[0], TryAgain) and reply[1] == b"x"


# --- one hash tag ----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "tag"), [
    ("plain", "plain"), ("a{tag}b", "tag"), ("{}x", "{}x"), ("a{}b{c}", "a{}b{c}"),
    ("x{y", "x{y"), ("{a}{b}", "a"), ("p{é}", "é"), ("pushup:{p7-2}:log", "p7-2")])
def test_one_hash_tag_rule_for_slots_and_partitions(name: str, tag: str) -> None:
    assert slots.hash_tag(name) == tag
    assert slots.key_slot(name) == slots.key_slot(tag) == slots.key_slot(name.encode())
    assert partitions.partition_of(name, 16) == partitions.partition_of(tag, 16)


def test_partitions_hash_by_the_slots_rule_itself() -> None:
    assert partitions.hash_tag is slots.hash_tag
