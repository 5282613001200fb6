"""pushup/backplane/disk_streams.py: the streams a data directory kept come back
at start, however they are linked; here a chain of forks deeper than Python's
recursion, as a data directory written before chains were bounded holds it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock

from pushup.backplane.disk_streams import StreamsFile
from tests.core.test_streams_chains import DEEP, kept_chain

START = 1_763_800_000.0


def keep(path: Path, deadline: int | None = None) -> list[str]:
    """A data directory at ``path`` holding a chain of ``DEEP`` forks (each
    ancestor deleted, kept for its fork); the chain's paths, root first."""
    kept = StreamsFile(str(path))
    kept.db.execute("PRAGMA synchronous=OFF")  # a fixture's thousands of rows, not a node's
    chain = kept_chain(DEEP, deadline)
    for stream in chain:
        stream.path = "/v1/stream" + stream.path
        stream.fork_request = (None if stream.source is None else
                               ("/v1/stream" + stream.source.path, None, 0))
        kept.saved(stream, stream.entries, True)
    kept.close()
    return [stream.path for stream in chain]


def boot(make_node: Callable[..., Any], path: Path) -> Any:
    clock = Clock()
    clock.advance(START)
    h = make_node(clock=clock, data_dir=str(path))
    h.node.start()
    return h


def test_a_kept_chain_deeper_than_the_recursion_limit_is_read_and_deleted_after_a_restart(
        make_node: Callable[..., Any], tmp_path: Path) -> None:
    paths = keep(tmp_path)
    h = boot(make_node, tmp_path)
    read = h.get(paths[-1])
    assert read.status == 200
    assert read.body == b"".join(b"%d" % (level % 10) for level in range(DEEP + 1))
    assert h.request("GET", paths[0]).status == 410
    assert h.request("DELETE", paths[-1]).status == 204
    assert {h.request("HEAD", p).status for p in paths} == {404}
    assert h.request("PUT", paths[0]).status == 201  # every path is free again


def test_a_kept_deep_fork_expired_while_down_goes_with_its_ancestors_at_start(
        make_node: Callable[..., Any], tmp_path: Path) -> None:
    paths = keep(tmp_path, deadline=int(START * 1e6) - 1)
    h = boot(make_node, tmp_path)
    assert {h.request("HEAD", p).status for p in (paths[0], paths[-1])} == {404}
    assert h.request("PUT", paths[0]).status == 201
    h.node.data.close()
    assert len(StreamsFile(str(tmp_path)).load()) == 1  # the one just made: the chain is gone
