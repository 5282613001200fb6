"""Durable Stream retention over HTTP (issue 39, part 2), on the node's own
front fed bytes on a Clock: ``Stream-Retention-Age`` / ``Stream-Retention-Bytes``
at creation (or ``--stream-retention-age`` / ``-bytes``), HEAD saying them and
the earliest offset kept, a read, long poll or SSE of an offset before it 410
``offset_gone`` (PROTOCOL.md §5.6) with ``Stream-Earliest-Offset``, a read from
-1 starting there; with ``--data-dir``, all of it kept across a restart."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TEXT = {"Content-Type": "text/plain"}


def fill(h: Any, path: str, count: int, size: int = 100) -> list[str]:
    """``count`` appends of ``size`` bytes each (their number first); their offsets."""
    offsets = []
    for i in range(count):
        r = h.request("POST", path, b"%03d" % i + b"." * (size - 3), TEXT)
        assert r.status == 204, r
        offsets.append(r.header("stream-next-offset"))
    return offsets


def test_a_read_of_an_offset_retention_let_go_is_410_naming_the_earliest(node, check_error):
    path = "/v1/stream/kept"
    assert node.request("PUT", path, headers={**TEXT, "Stream-Retention-Bytes": "250"}
                        ).status == 201
    offsets = fill(node, path, 10)
    head = node.request("HEAD", path)
    assert head.header("stream-retention-bytes") == "250"
    assert head.header("stream-earliest-offset") == offsets[7]
    whole = node.request("GET", path + "?offset=-1")  # the start is the earliest kept
    assert whole.status == 200 and whole.body[:3] == b"008" and len(whole.body) == 200
    for live in ("", "&live=long-poll", "&live=sse"):
        gone = node.request("GET", f"{path}?offset={offsets[2]}{live}")
        check_error(gone, 410, "offset_gone")
        assert gone.header("stream-earliest-offset") == offsets[7]
    assert node.request("GET", f"{path}?offset={offsets[8]}").body[:3] == b"009"


@pytest.mark.parametrize("header, value", [
    ("Stream-Retention-Age", "0"), ("Stream-Retention-Bytes", "-1"),
    ("Stream-Retention-Bytes", "ten")])
def test_a_retention_not_a_whole_number_from_1_is_400(node, check_error, header, value):
    check_error(node.request("PUT", "/v1/stream/r", headers={**TEXT, header: value}), 400,
                None)


def test_a_fork_is_given_no_retention_and_a_repeated_put_must_ask_the_same(node, check_error):
    assert node.request("PUT", "/v1/stream/src", headers={
        **TEXT, "Stream-Retention-Age": "60"}).status == 201
    assert node.request("PUT", "/v1/stream/src", headers={
        **TEXT, "Stream-Retention-Age": "60"}).status == 200
    check_error(node.request("PUT", "/v1/stream/src", headers=TEXT), 409, "stream_conflict")
    check_error(node.request("PUT", "/v1/stream/fork", headers={
        "Stream-Forked-From": "/v1/stream/src", "Stream-Retention-Age": "5"}), 400, None)


def test_the_node_default_applies_to_a_creation_that_gives_none(make_node, check_error):
    h = make_node(stream_retention_age=30)
    assert h.request("PUT", "/v1/stream/d", headers=TEXT).status == 201
    assert h.request("HEAD", "/v1/stream/d").header("stream-retention-age") == "30"
    first = fill(h, "/v1/stream/d", 1)[0]
    h.clock.advance(40)  # past 30 s and its share: the first append goes at the next
    second = fill(h, "/v1/stream/d", 1)[0]
    assert h.request("HEAD", "/v1/stream/d").header("stream-earliest-offset") == first
    assert h.request("GET", "/v1/stream/d?offset=-1").body[:3] == b"000"  # the second's
    h.clock.advance(40)  # the newest always stays, however old
    assert h.request("GET", f"/v1/stream/d?offset={first}").status == 200
    check_error(h.request("GET", "/v1/stream/d?offset=0000000000000000_0000000000000000"),
                410, "offset_gone")
    assert second.startswith("0000000000000002_")


def test_a_data_dir_keeps_the_retention_and_the_earliest_offset_across_a_restart(
        make_node: Callable[..., Any], tmp_path: Path, check_error) -> None:
    path = "/v1/stream/kept"
    h = make_node(data_dir=str(tmp_path))
    h.node.start()
    h.request("PUT", path, headers={**TEXT, "Stream-Retention-Bytes": "250"})
    offsets = fill(h, path, 10)
    h.node.data.close()  # as a node that stops lets its data directory go
    again = make_node(data_dir=str(tmp_path))
    again.node.start()
    assert again.request("HEAD", path).header("stream-earliest-offset") == offsets[7]
    check_error(again.request("GET", f"{path}?offset={offsets[1]}"), 410, "offset_gone")
    assert again.request("GET", path + "?offset=-1").body[:3] == b"008"
    assert fill(again, path, 1)[0] == "0000000000000011_0000000000001100"  # none reused
    again.node.data.close()
