"""Which node owns a Durable Stream on the mesh, and the signed mark of a hop
(pushup/backplane/mesh/owners.py)."""
from __future__ import annotations

import pytest

from pushup.backplane.mesh.owners import (
    SERVE_HERE,
    TO_OWNER,
    advertised,
    hop_kind,
    hop_mark,
    member,
    owner_of,
)
from pushup.core import errors

NODES = ["http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"]
PATHS = [f"/v1/stream/chat/room-{i}" for i in range(3000)]


def test_every_node_picks_the_same_owner_whatever_order_it_lists_the_members_in():
    assert [owner_of(p, NODES) for p in PATHS] == [owner_of(p, NODES[::-1]) for p in PATHS]


def test_paths_spread_over_every_member():
    counts = {node: 0 for node in NODES}
    for path in PATHS:
        counts[owner_of(path, NODES)] += 1
    assert all(800 < n < 1200 for n in counts.values()), counts


def test_a_member_added_takes_paths_only_from_the_others_never_moves_them_between_them():
    grown = [*NODES, "http://10.0.0.4:8080"]
    for path in PATHS:
        after = owner_of(path, grown)
        assert after in (owner_of(path, NODES), grown[-1])


def test_a_member_is_spelled_alike_however_a_node_was_given_it():
    assert member("HTTP://Node-1.example:80/") == member("http://node-1.example") \
        == "http://node-1.example"
    assert member("http://127.0.0.1:8081/") == advertised("127.0.0.1", 8081) \
        == "http://127.0.0.1:8081"
    assert advertised("::1", 8080) == "http://[::1]:8080"


def test_a_hop_signed_with_the_cluster_secret_says_its_kind():
    mark = hop_mark("secret", SERVE_HERE, b"POST", b"/v1/stream/a", 1000.0)
    assert hop_kind("secret", mark, b"POST", b"/v1/stream/a", 1010.0) == SERVE_HERE


@pytest.mark.parametrize("secret, method, path, now", [
    ("another", b"POST", b"/v1/stream/a", 1000.0),  # not the cluster's secret
    ("secret", b"DELETE", b"/v1/stream/a", 1000.0),  # another method
    ("secret", b"POST", b"/v1/stream/b", 1000.0),  # another stream
    ("secret", b"POST", b"/v1/stream/a", 2000.0),  # too old
    ("", b"POST", b"/v1/stream/a", 1000.0),  # a node without a secret trusts no mark
])
def test_a_hop_signed_otherwise_is_401(secret, method, path, now):
    mark = hop_mark("secret", TO_OWNER, b"POST", b"/v1/stream/a", 1000.0)
    with pytest.raises(errors.Unauthorized):
        hop_kind(secret, mark, method, path, now)


def test_a_hop_of_another_kind_than_signed_is_401():
    mark = hop_mark("secret", TO_OWNER, b"GET", b"/v1/stream/a", 1000.0)
    with pytest.raises(errors.Unauthorized):
        hop_kind("secret", mark.replace(b"owner", b"here", 1), b"GET", b"/v1/stream/a", 1000.0)
