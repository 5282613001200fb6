"""--cors-origin and --publish-token."""
from __future__ import annotations

import pytest

from tests.e2e.support import assert_error, assert_json_ok, q, serving, uniq

ORIGIN = "https://app.example.com"
ACAO = "Access-Control-Allow-Origin"


@pytest.fixture(scope="module")
def cors_node():
    yield from serving("--cors-origin", ORIGIN, "--publish-token", "tok", token="tok")


def test_cors_header_on_every_response(cors_node):
    n = cors_node
    ch = uniq("cors")
    hdr = {"Origin": ORIGIN}
    responses = {
        "publish": n.publish_raw([ch], 1, headers=hdr),
        "subscribe": n.subscribe_raw([ch], since="0", timeout=0, headers=hdr),
        "timeout": n.subscribe_raw([uniq()], timeout=0.2, headers=hdr),
        "bad_param": n.subscribe_raw([ch], timeout="-1", headers=hdr),
        "not_found": n.get("/nope", headers=hdr),
        "405": n.request("PUT", "/publish", raw_body=b"{}", headers=hdr),
        "401": n.publish_raw([ch], 1, headers=hdr, token="wrong"),
        "404 channel": n.get("/channels/" + uniq("x"), headers=hdr),
        "create": n.post("/channels", {}, headers=hdr),
        "health": n.get("/health", headers=hdr),
        "stats": n.get("/stats", headers=hdr),
        "metrics": n.get("/metrics", headers=hdr),
        "bad_json": n.post("/publish", raw_body=b"{", headers=hdr),
        "no origin header": n.subscribe_raw([ch], timeout=0),
    }
    for what, r in responses.items():
        assert r.header(ACAO) == ORIGIN, (what, r, dict(r.headers))


@pytest.mark.parametrize("path", ["/publish", "/subscribe", "/channels", "/channels/x",
                                  "/channels/x/renew", "/health", "/nope/anything"])
def test_options_preflight_204_without_token(cors_node, path):
    r = cors_node.request("OPTIONS", path, token="",
                          headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert r.status == 204, r
    assert r.header(ACAO) == ORIGIN
    assert r.body == b""


def test_cors_star(start_node):
    n = start_node("--cors-origin", "*")
    assert n.subscribe_raw([uniq()], timeout=0).header(ACAO) == "*"
    assert n.get("/nope").header(ACAO) == "*"
    assert n.request("OPTIONS", "/subscribe").status == 204


def test_without_cors_origin_no_header_and_options_405(node):
    r = node.request("OPTIONS", "/subscribe", headers={"Origin": ORIGIN})
    assert_error(r, 405, "method_not_allowed")
    assert r.header("Allow")
    for r in (node.subscribe_raw([uniq()], timeout=0, headers={"Origin": ORIGIN}),
              node.get("/nope", headers={"Origin": ORIGIN}),
              node.publish_raw([uniq()], 1, headers={"Origin": ORIGIN})):
        assert r.header(ACAO) is None, dict(r.headers)


# ---- publish token ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def auth_node():
    yield from serving("--publish-token", "s3cret")


BAD_AUTH = [None, "Bearer wrong", "Bearer", "Basic czNjcmV0", "s3cret",
            "Bearer s3cret2", "Bearer s3cre"]


@pytest.mark.parametrize("auth", BAD_AUTH)
def test_publish_requires_token(auth_node, auth):
    n = auth_node
    ch = uniq("auth")
    headers = {"Authorization": auth} if auth else {}
    assert_error(n.post("/publish", {"channels": [ch], "data": 1}, headers=headers),
                 401, "unauthorized")
    assert_error(n.post("/publish", {"messages": [{"channels": [ch], "data": 1}]},
                        headers=headers), 401, "unauthorized")
    assert n.subscribe([ch], since="0")["messages"] == []  # nothing was published


def test_publish_with_token(auth_node):
    ch = uniq("auth")
    pub = auth_node.publish([ch], 1, token="s3cret")
    body = auth_node.subscribe([ch], since="0")  # subscribing needs no token
    assert [m["id"] for m in body["messages"]] == [pub["id"]]


def test_channels_endpoints_require_token(auth_node):
    n = auth_node
    name = uniq("authch")
    bad = {"Authorization": "Bearer nope"}
    for headers in ({}, bad):
        assert_error(n.post("/channels", {"name": name}, headers=headers), 401, "unauthorized")
        assert_error(n.post("/channels", {}, headers=headers), 401, "unauthorized")
    assert_json_ok(n.post("/channels", {"name": name}, token="s3cret"), 201)
    for headers in ({}, bad):
        assert_error(n.get("/channels/" + q(name), headers=headers), 401, "unauthorized")
        assert_error(n.post(f"/channels/{q(name)}/renew", {}, headers=headers), 401,
                     "unauthorized")
        assert_error(n.request("DELETE", "/channels/" + q(name), headers=headers), 401,
                     "unauthorized")
        # unknown channel: still 401 first, not a 404 that leaks existence
        assert_error(n.get("/channels/" + uniq("unknown"), headers=headers), 401, "unauthorized")
    assert assert_json_ok(n.get("/channels/" + q(name), token="s3cret"))["channel"] == name
    assert_json_ok(n.post(f"/channels/{q(name)}/renew", {}, token="s3cret"))
    assert n.request("DELETE", "/channels/" + q(name), token="s3cret").status == 204


def test_subscribe_needs_no_token_and_is_not_refused_with_one(auth_node):
    ch = uniq("subauth")
    auth_node.subscribe([ch], timeout=0)
    auth_node.subscribe([ch], timeout=0, token="whatever")
