"""Channel lifecycle: create, renew, delete, info, name rules, channel ttl."""
from __future__ import annotations

import time

import pytest

from tests.e2e.support import assert_error, assert_json_ok, q, uniq, wait_until


class Stamp:
    """Wall-clock bounds around a request: the node (same clock) stamped it in between."""

    def __enter__(self):
        self.before = time.time()
        return self

    def __exit__(self, *exc):
        self.after = time.time()

    def plus(self, t: float, ttl: float) -> bool:
        """`t` is the node's now + ttl while serving the request (µs rounding allowed)."""
        return self.before + ttl - 1e-6 <= t <= self.after + ttl + 1e-6


def test_create_named_channel(node):
    name = uniq("named")
    with Stamp() as created:
        body = assert_json_ok(node.post("/channels", {"name": name, "ttl": 3600}), 201)
    assert body["channel"] == name
    assert isinstance(body["expires_at"], float | int)
    assert created.plus(body["expires_at"], 3600), (created.__dict__, body)
    info = assert_json_ok(node.channel_info(name))
    assert info["channel"] == name
    assert info["messages"] == 0 and info["subscribers"] == 0
    assert info["expires_at"] == body["expires_at"]


def test_create_without_name_generates_unique_usable_names(node):
    names = set()
    for _ in range(5):
        body = assert_json_ok(node.post("/channels", {"ttl": 600}), 201)
        assert isinstance(body["channel"], str) and body["channel"]
        names.add(body["channel"])
    assert len(names) == 5
    name = names.pop()
    assert 1 <= len(name) <= 200 and "," not in name and not any(c.isspace() for c in name)
    pub = node.publish([name], 1)
    got = node.subscribe([name], since="0")
    assert [m["id"] for m in got["messages"]] == [pub["id"]]


def test_create_with_default_ttl(node):
    with Stamp() as created:
        body = assert_json_ok(node.post("/channels", {}), 201)
    assert created.plus(body["expires_at"], 3600), body  # default --channel-ttl 3600


def test_create_taken_name_is_409(node):
    name = uniq("taken")
    assert_json_ok(node.post("/channels", {"name": name}), 201)
    assert_error(node.post("/channels", {"name": name}), 409, "channel_exists")


def test_create_name_taken_by_implicit_publish_is_409(node):
    name = uniq("implicit")
    node.publish([name], "x")
    assert_error(node.post("/channels", {"name": name}), 409, "channel_exists")


def test_subscribe_creates_channel_implicitly(node):
    name = uniq("bysub")
    node.subscribe([name], timeout=0)
    info = assert_json_ok(node.channel_info(name))
    assert info["channel"] == name and info["messages"] == 0


@pytest.mark.parametrize(("body", "code"), [
    ({"name": 5}, "bad_channel_name"), ({"name": ""}, "bad_channel_name"),
    ({"ttl": "x"}, "bad_parameter"), ({"ttl": -1}, "bad_parameter"),
    ({"name": "a b"}, "bad_channel_name")])
def test_create_bad_body_is_400(node, body, code):
    assert_error(node.post("/channels", body), 400, code)


@pytest.mark.parametrize("body", [[1], "str", 5])
def test_create_non_object_body_is_400(node, body):
    assert_error(node.post("/channels", body), 400, "bad_json")


def test_create_bad_json_is_400(node):
    assert_error(node.post("/channels", raw_body=b"{nope"), 400, "bad_json")


def test_renew(node):
    name = uniq("renew")
    assert_json_ok(node.post("/channels", {"name": name, "ttl": 100}), 201)
    with Stamp() as renewed:
        body = assert_json_ok(node.post(f"/channels/{q(name)}/renew", {"ttl": 5000}))
    assert body["channel"] == name and renewed.plus(body["expires_at"], 5000), body
    info = assert_json_ok(node.channel_info(name))
    assert info["expires_at"] == body["expires_at"]
    # body optional: renews with the channel's own ttl, now 5000 (not the default 3600)
    with Stamp() as again:
        body = assert_json_ok(node.post(f"/channels/{q(name)}/renew", raw_body=b""))
    assert again.plus(body["expires_at"], 5000), (again.__dict__, body)


def test_renew_unknown_is_404(node):
    r = node.post(f"/channels/{uniq('nochan')}/renew", {"ttl": 10})
    assert_error(r, 404, "no_such_channel")


def test_renew_bad_ttl_is_400(node):
    name = uniq("renewbad")
    node.post("/channels", {"name": name})
    assert_error(node.post(f"/channels/{q(name)}/renew", {"ttl": "soon"}), 400, "bad_parameter")


def test_delete(node):
    name = uniq("del")
    node.publish([name], "gone")
    r = node.request("DELETE", "/channels/" + q(name))
    assert r.status == 204 and r.body == b"", r
    assert_error(node.channel_info(name), 404, "no_such_channel")
    assert_error(node.request("DELETE", "/channels/" + q(name)), 404, "no_such_channel")
    # its messages are gone: a new subscribe (re-creating it) sees none of them
    got = node.subscribe([name], since="0", timeout=0)
    assert got["messages"] == []


def test_delete_unknown_is_404(node):
    assert_error(node.request("DELETE", "/channels/" + uniq("nochan")), 404, "no_such_channel")


def test_delete_answers_waiting_subscriber_at_once(node):
    name, other = uniq("delwait"), uniq("other")
    node.post("/channels", {"name": name})
    cur = node.subscribe([name, other], timeout=0)["cursor"]
    pending = node.subscribe_async([name, other], since=cur, timeout=60)
    node.wait_subscribers(name, 1)
    r = node.request("DELETE", "/channels/" + q(name))
    assert r.status == 204, r
    resp = pending.result(10)
    body = assert_json_ok(resp)
    assert body["messages"] == []
    assert name in body["closed"] and other not in body["closed"]
    assert isinstance(body["cursor"], str) and body["cursor"]


def test_info_counts_messages_and_subscribers(node):
    name = uniq("info")
    for i in range(3):
        node.publish([name], i)
    info = assert_json_ok(node.channel_info(name))
    assert info["messages"] == 3 and info["subscribers"] == 0
    assert set(info) >= {"channel", "expires_at", "messages", "subscribers"}
    cur = node.subscribe([name])["cursor"]
    p1 = node.subscribe_async([name], since=cur, timeout=60)
    p2 = node.subscribe_async([name], since=cur, timeout=60)
    node.wait_subscribers(name, 2)
    node.publish([name], "wake")
    for p in (p1, p2):
        assert [m["data"] for m in assert_json_ok(p.result(10))["messages"]] == ["wake"]
    node.wait_subscribers(name, 0)
    assert assert_json_ok(node.channel_info(name))["messages"] == 4


def test_info_unknown_is_404(node):
    assert_error(node.channel_info(uniq("nochan")), 404, "no_such_channel")


# ---- names ------------------------------------------------------------------------------

VALID = ["author:John", "tag:c++", "a" * 200, "x", "日本語", "a/b", "100%", "q?x=1&y#z", "é"]
INVALID = ["a" * 201, "a b", "a\tb", "a\nb", "a\x00b", "a\x01b", "a\x1fb", "a\x7fb",
           "a,b", "\u2003x", "x\u00a0"]


@pytest.mark.parametrize("name", VALID, ids=lambda n: repr(n[:20]))
def test_valid_names_everywhere(node, name):
    # make unique while keeping the character class (200-char name stays 200)
    if len(name) < 180:
        name = name + uniq("-")[1:]
    assert_json_ok(node.post("/channels", {"name": name}), 201)
    info = assert_json_ok(node.channel_info(name))
    assert info["channel"] == name
    pub = node.publish([name], "v")
    assert pub["channels"] == [name]
    got = node.subscribe([name], since="0")
    assert [m["id"] for m in got["messages"]] == [pub["id"]]
    assert got["messages"][0]["channels"] == [name]
    assert assert_json_ok(node.post(f"/channels/{q(name)}/renew", {"ttl": 60}))["channel"] == name
    assert node.request("DELETE", "/channels/" + q(name)).status == 204


@pytest.mark.parametrize("name", INVALID, ids=lambda n: repr(n[:20]))
def test_invalid_names_rejected_everywhere(node, name):
    assert_error(node.publish_raw([name], 1), 400, "bad_channel_name")
    assert_error(node.post("/channels", {"name": name}), 400, "bad_channel_name")
    if "," not in name:  # in a query string a comma separates names
        assert_error(node.subscribe_raw([name], timeout=0), 400, "bad_channel_name")
    else:
        node.subscribe([name], timeout=0)  # two valid names "a" and "b"


def test_empty_name_rejected(node):
    assert_error(node.publish_raw([""], 1), 400, "bad_channel_name")


# ---- channel ttl ------------------------------------------------------------------------

def test_channel_ttl_expiry_removes_channel_and_messages(start_node):
    n = start_node("--channel-ttl", "1")
    name = uniq("cttl")
    n.publish([name], "old")
    assert assert_json_ok(n.channel_info(name))["messages"] == 1
    wait_until(lambda: n.channel_info(name).status == 404, 15, msg="channel expiry")
    assert n.subscribe([name], since="0")["messages"] == []


def test_channel_with_waiting_subscriber_does_not_expire(start_node):
    n = start_node("--channel-ttl", "0.5")
    name, control = uniq("cttlw"), uniq("control")
    cur = n.subscribe([name])["cursor"]  # creates `name`: expires 0.5 s from now
    p = n.subscribe_async([name], since=cur, timeout=60)
    n.wait_subscribers(name, 1)
    # `control` is created after `name`, so it expires after it: once the node has
    # removed `control`, `name` is past its own ttl too, and only the held poll keeps it.
    n.publish([control], "idle")
    wait_until(lambda: n.channel_info(control).status == 404, 15, msg="control channel expiry")
    info = assert_json_ok(n.channel_info(name))
    assert info["subscribers"] == 1 and not p.done()
    pub = n.publish([name], "still here")
    body = assert_json_ok(p.result(10))
    assert [m["id"] for m in body["messages"]] == [pub["id"]]


def test_explicit_ttl_and_renew(start_node):
    n = start_node()
    short, renewed = uniq("short"), uniq("renewed")
    n.post("/channels", {"name": short, "ttl": 0.5})
    n.post("/channels", {"name": renewed, "ttl": 0.5})
    assert_json_ok(n.post(f"/channels/{q(renewed)}/renew", {"ttl": 3600}))
    wait_until(lambda: n.channel_info(short).status == 404, 15, msg="explicit ttl expiry")
    assert n.channel_info(renewed).status == 200


def test_publish_moves_channel_expiry(start_node):
    """A publish renews its channels to now + ttl. (That the expiry timer then honours
    the new time is pinned on a clock in tests/core/test_service.py
    test_publish_extends_a_channels_life; test_channel_ttl_expiry_removes_channel_and_messages
    above runs the real timer.)"""
    n = start_node("--channel-ttl", "1000")
    name = uniq("alive")
    with Stamp() as first:
        n.publish([name], "one")
    e1 = assert_json_ok(n.channel_info(name))["expires_at"]
    assert first.plus(e1, 1000), (first.__dict__, e1)
    with Stamp() as second:
        n.publish([name], "two")
    info = assert_json_ok(n.channel_info(name))
    assert second.plus(info["expires_at"], 1000) and info["expires_at"] > e1, (e1, info)
    assert info["messages"] == 2
