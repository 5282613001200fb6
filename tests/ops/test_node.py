"""pushup/ops/node.py, the composition root: the configuration picks the backplane
(a lone node, a data directory, the mesh, Redis), the node id comes from the
configuration, else the data directory, else the host and port, and the figures are
on the client port unless ``--admin-port`` moves them. (Its drain: test_drain.py;
its listening and workers: the e2e and cluster tests.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pushup.backplane import Alone
from pushup.backplane.disk import Durable
from pushup.backplane.mesh.mesh import Mesh
from pushup.backplane.redis.engine import RedisEngine


@pytest.mark.parametrize(("settings", "engine", "kind"), [
    ({}, "single", Alone),
    ({"data_dir": "DIR"}, "single", Durable),
    ({"peer": ("http://127.0.0.1:9",), "cluster_secret": "s" * 32}, "mesh", Mesh),
    ({"cluster_secret": "s" * 32}, "mesh", Mesh),  # a mesh peers may join
    ({"engine": "redis://127.0.0.1:9/0"}, "redis", RedisEngine),
], ids=["alone", "data-dir", "peers", "secret-only", "redis"])
def test_the_configuration_picks_the_backplane(make_node: Callable[..., Any],
                                               tmp_path: Path, settings: dict[str, Any],
                                               engine: str, kind: type) -> None:
    settings = {k: str(tmp_path) if v == "DIR" else v for k, v in settings.items()}
    node = make_node(**settings).node
    assert isinstance(node.backplane, kind)
    assert node.stats()["engine"] == engine
    assert (node.mesh is node.backplane) == (kind is Mesh)
    if node.data is not None:
        node.data.close()


def test_the_node_id_is_configured_else_kept_in_the_data_directory(
        make_node: Callable[..., Any], tmp_path: Path) -> None:
    first = make_node(node_id="kept", data_dir=str(tmp_path)).node
    assert first.stats()["node_id"] == "kept"
    first.data.close()
    again = make_node(node_id="", data_dir=str(tmp_path)).node
    assert again.stats()["node_id"] == "kept"
    again.data.close()


def test_without_an_id_a_node_is_named_after_its_host_and_port(
        make_node: Callable[..., Any]) -> None:
    node_id = make_node(node_id="", port=8123).node.stats()["node_id"]
    assert node_id.endswith("-8123") and len(node_id) > len("-8123")


def test_the_figures_leave_the_client_port_for_the_admin_port(
        make_node: Callable[..., Any]) -> None:
    plain = make_node()
    assert plain.get("/stats").status == 200 and plain.node.admin is None
    moved = make_node(admin_port=9100)
    assert moved.get("/stats").status == 404 and moved.get("/metrics").status == 404
    assert moved.node.admin is not None
