"""Routing, the single error shape, /health, response headers."""
from __future__ import annotations

import re

import pytest

from tests.e2e.support import assert_error, assert_json_ok, uniq


@pytest.mark.parametrize("path", ["//", "/nope", "/publish/extra", "/subscribe/x",
                                  "/channels/a/b/c",
                                  "/healthz", "/channels/a/renew/x"])
def test_unknown_path_is_404_not_found(node, path):
    r = node.get(path)
    assert_error(r, 404, "not_found")


@pytest.mark.parametrize("method,path,allowed", [
    ("GET", "/publish", {"POST"}),
    ("PUT", "/publish", {"POST"}),
    ("DELETE", "/publish", {"POST"}),
    ("POST", "/subscribe", {"GET"}),
    ("DELETE", "/subscribe", {"GET"}),
    ("POST", "/health", {"GET"}),
    ("POST", "/stats", {"GET"}),
    ("POST", "/metrics", {"GET"}),
    ("PUT", "/channels", {"POST"}),
    ("GET", "/channels", {"POST"}),
    ("GET", "/channels/x/renew", {"POST"}),
    ("PUT", "/channels/x", {"GET", "DELETE"}),
    ("POST", "/channels/x", {"GET", "DELETE"}),
])
def test_wrong_method_is_405_with_allow(node, method, path, allowed):
    r = node.request(method, path, raw_body=b"{}" if method in ("POST", "PUT") else None)
    assert_error(r, 405, "method_not_allowed")
    allow = r.header("Allow")
    assert allow, "405 without an Allow header"
    methods = {m.strip().upper() for m in allow.split(",") if m.strip()}
    assert allowed <= methods, (allow, allowed)
    assert method not in methods, allow


def test_health_ok(node):
    body = assert_json_ok(node.get("/health"))
    assert body["status"] == "ok"


def test_server_header_has_no_version(node):
    for r in (node.get("/health"), node.get("/nope"),
              node.subscribe_raw([uniq()], timeout=0)):
        server = r.header("Server")
        if server is not None:
            assert not re.search(r"\d", server), server


def test_success_bodies_are_utf8_json(node):
    ch = uniq("ct")
    r = node.publish_raw([ch], {"s": "héllo ✓ 日本"})
    assert_json_ok(r, 201)
    r = node.subscribe_raw([ch], since="0", timeout=0)
    body = assert_json_ok(r)
    assert body["messages"][0]["data"] == {"s": "héllo ✓ 日本"}
    # the body really is UTF-8 (json.loads on the decoded text above would fail otherwise)
    r.body.decode("utf-8")


def test_errors_on_every_endpoint_share_one_shape(node):
    ch = uniq()
    cases = [
        (node.post("/publish", raw_body=b"not json"), 400),
        (node.get("/subscribe"), 400),
        (node.get("/channels/" + uniq("missing")), 404),
        (node.request("DELETE", "/channels/" + uniq("missing")), 404),
        (node.post("/channels/" + uniq("missing") + "/renew", {}), 404),
        (node.post("/channels", {"name": ch}), 201),
        (node.post("/channels", {"name": ch}), 409),
    ]
    for r, status in cases:
        if status >= 400:
            assert_error(r, status)
        else:
            assert r.status == status, r
