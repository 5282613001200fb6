"""Presence on one real node: GET /presence (occupancy, members by user, its
errors and authorisation) and a subscribe with presence=1 (long poll and SSE)
told who joins and leaves."""
from __future__ import annotations

import time
import urllib.parse

import jwt
import pytest

from tests.e2e.support import Pending, assert_error, assert_json_ok, run_cli, serving, uniq
from tests.sse_client import SSE

SECRET = "presence-test-secret-of-32-bytes-at-least"
PUBLISH = "presence-publish-token"
WINDOW = "2"  # seconds a released subscription counts on (a poll that ends re-polls well within it)


def token(user: str | None, channels: list[str], info: dict | None = None) -> str:
    claims: dict = {"channels": channels, "exp": int(time.time()) + 600}
    if user is not None:
        claims["sub"] = user
    if info is not None:
        claims["info"] = info
    return jwt.encode(claims, SECRET, algorithm="HS256")


@pytest.fixture(scope="module")
def node():
    yield from serving("--presence", "--presence-window", WINDOW, "--subscribe-secret", SECRET,
                       "--publish-token", PUBLISH, "--presence-members", "2", token=PUBLISH)


def presence(node, channels, members=True, tok=PUBLISH):
    q = urllib.parse.urlencode({"channels": ",".join(channels), "members": int(members)})
    return assert_json_ok(node.get(f"/presence?{q}", token=tok))["channels"]


def poll(node, ch, tok, client=None, timeout=30, since="now", **extra):
    q = {"channels": ch, "since": since, "timeout": timeout, "token": tok, **extra}
    if client:
        q["client"] = client
    return node.get("/subscribe?" + urllib.parse.urlencode(q), timeout=timeout + 15, token="")


def until(condition, what, guard=15.0):
    deadline = time.monotonic() + guard
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"hang guard: {what} not within {guard} s"
        time.sleep(0.05)


def test_a_user_with_two_tabs_is_one_member_and_the_count_is_every_tab(node):
    ch = uniq("room")
    ann = token("ann", [ch], {"name": "Ann"})
    bob = token("bob", [ch])
    polls = [Pending(lambda t=t, c=c: poll(node, ch, t, c, timeout=3))
             for t, c in ((ann, "tab1"), (ann, "tab2"), (bob, "tab3"))]
    seen = until(lambda: (p := presence(node, [ch])[ch])["occupancy"] == 3 and p,
                 "three subscribers")
    assert sorted(seen["members"], key=lambda m: m["user"]) == [
        {"user": "ann", "info": {"name": "Ann"}}, {"user": "bob"}]
    assert seen["members_truncated"] is False
    for p in polls:
        assert_json_ok(p.result(20))
    # between polls the subscribers still count, for the window; then they leave
    until(lambda: presence(node, [ch])[ch]["occupancy"] == 0, "the window to pass")
    assert presence(node, [ch])[ch] == {"occupancy": 0, "members": [],
                                        "members_truncated": False}


def test_a_token_from_pushup_token_sub_info_makes_its_user_a_member_with_that_info(node):
    ch = uniq("minted")
    minted = run_cli("token", "--channels", ch, "--sub", "cid", "--info", '{"name": "Cid"}',
                     env={"PUSHUP_SUBSCRIBE_SECRET": SECRET})
    assert minted.returncode == 0, minted.stderr
    held = Pending(lambda: poll(node, ch, minted.stdout.strip(), "tab1", timeout=3))
    seen = until(lambda: (p := presence(node, [ch])[ch])["occupancy"] == 1 and p, "Cid")
    assert seen["members"] == [{"user": "cid", "info": {"name": "Cid"}}]
    assert_json_ok(held.result(20))


def test_the_member_list_is_capped_and_the_count_stays_exact(node):
    ch = uniq("big")
    polls = [Pending(lambda u=u: poll(node, ch, token(u, [ch]), timeout=3))
             for u in ("u1", "u2", "u3")]
    seen = until(lambda: (p := presence(node, [ch])[ch])["occupancy"] == 3 and p, "three")
    assert len(seen["members"]) == 2 and seen["members_truncated"] is True
    for p in polls:
        p.result(20)


def test_presence_is_authorised_like_a_subscribe_or_with_the_publish_token(node):
    ch, other = uniq("auth"), uniq("other")
    q = f"/presence?channels={ch}"
    assert_error(node.get(q, token=""), 401, "unauthorized")
    assert_error(node.get(q, token=token("ann", [other])), 403, "forbidden")
    assert assert_json_ok(node.get(q, token=token("ann", [ch])))["channels"] == {
        ch: {"occupancy": 0}}
    assert_error(node.get("/presence", token=PUBLISH), 400, "bad_parameter")
    assert_error(node.get(q + "&members=yes", token=PUBLISH), 400, "bad_parameter")
    assert_error(node.get(f"/subscribe?channels={ch}&presence=2&token={token('a', [ch])}",
                          token=""), 400, "bad_parameter")
    assert_json_ok(node.get("/health"))  # and the node keeps serving


def test_a_long_poll_with_presence_is_told_who_joins_and_leaves(node):
    ch = uniq("follow")
    me = token("me", [ch])
    first = assert_json_ok(poll(node, ch, me, "mine", presence=1))  # at once: who is here
    assert first["presence"] == [{"channel": ch, "event": "member_added", "user": "me"}]
    waiting = Pending(lambda: poll(node, ch, me, "mine", since=first["cursor"], presence=1))
    node.wait_subscribers(ch, 1)  # the follower's poll is held
    ann = Pending(lambda: poll(node, ch, token("ann", [ch], {"n": 1}), "a1", timeout=1))
    joined = assert_json_ok(waiting.result(20))
    assert joined["presence"] == [{"channel": ch, "event": "member_added", "user": "ann",
                                   "info": {"n": 1}}]
    # the follower polls on at once (it stays a member); ann's poll ends, and
    # after the window she leaves
    leaving = Pending(lambda: poll(node, ch, me, "mine", since=joined["cursor"], presence=1))
    assert_json_ok(ann.result(20))
    left = assert_json_ok(leaving.result(20))
    assert left["presence"] == [{"channel": ch, "event": "member_removed", "user": "ann",
                                 "info": {"n": 1}}]
    published = node.publish([ch], "hi", token=PUBLISH)
    answer = assert_json_ok(poll(node, ch, me, "mine", since=left["cursor"], presence=1))
    assert [m["id"] for m in answer["messages"]] == [published["id"]]
    assert answer["presence"] == []


def test_an_event_stream_with_presence_gets_presence_events(node):
    ch = uniq("sse")
    stream = SSE("127.0.0.1", node.port, [ch], token=token("me", [ch]), presence="1")
    try:
        first = stream.all_events(2)
        assert first[0]["event"] == "cursor"
        assert first[1]["event"] == "presence"
        assert first[1]["data"] == f'{{"channel":"{ch}","event":"member_added","user":"me"}}'
        bob = Pending(lambda: poll(node, ch, token("bob", [ch]), "b", timeout=1))
        events = stream.all_events(3)
        assert events[2]["event"] == "presence" and '"user":"bob"' in events[2]["data"]
        bob.result(20)
    finally:
        stream.close()


def test_presence_is_off_unless_asked_for():
    for started in serving():
        assert_error(started.get("/presence?channels=a"), 404, "not_found")
        assert_error(started.get("/subscribe?channels=a&presence=1"), 400, "bad_parameter")
