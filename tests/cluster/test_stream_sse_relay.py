"""A Durable Stream's SSE response handed on through another mesh node reaches
the reader in whole events, each data event with its control event, however
the relaying node's reads of the serving node cut them (protocol §5.8; the
conformance suite's SSE reader stops at the first blank line after a line
reading ``event: control``, which a data line may hold: issue 39, part 4).

The condition is made certain rather than left to load: one data event larger
than one read of the relaying node (Twisted reads 64 KiB at a time), so the
serving node's single write always reaches the relay in more than one piece.
Real ``pushup serve`` processes on the mesh, read with a raw socket so that
each HTTP chunk the reader gets is seen as it came.
"""
from __future__ import annotations

import socket
import urllib.parse

from tests.cluster.clients import request
from tests.cluster.stream_checks import create, stream_url
from tests.cluster.test_streams_mesh import path_owned_by

# a payload whose lines read as SSE fields, and more than two reads' worth of it
TRAP = b"safe\r\n\r\nevent: control\r\ndata: {\"injected\":true}\r\n\r\n"
PAYLOAD = TRAP * (160 * 1024 // len(TRAP))


def first_chunk(url: str) -> bytes:
    """GET ``url`` as an event stream over HTTP/1.1: the first HTTP chunk of
    its body, as one read of the reader's gets it."""
    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(b"GET %s?%s HTTP/1.1\r\nHost: x\r\n\r\n"
                     % (parts.path.encode(), parts.query.encode()))
        reader = sock.makefile("rb")
        status = reader.readline()
        assert b" 200 " in status, status
        while reader.readline() not in (b"\r\n", b""):
            pass  # the head
        size = int(reader.readline().strip(), 16)
        return reader.read(size)


def test_a_relayed_sse_read_reaches_the_reader_in_whole_events(fresh_cluster):
    c = fresh_cluster(2, haproxy=False)
    path = path_owned_by(c, 0)
    create(c.bases[0], path)
    status, _, _ = request("POST", stream_url(c.bases[0], path), PAYLOAD,
                           {"Content-Type": "text/plain"})
    assert status == 204
    for i, base in enumerate(c.bases):  # node 0 serves it, node 1 hands it on
        got = first_chunk(stream_url(base, path) + "?offset=-1&live=sse")
        # a reader holds whole events only: the data event and, in the same
        # chunk, its control event
        assert got.count(b"\n\n") == 2, f"node {i}: a chunk of {len(got)} bytes ends mid-event"
        data, control, rest = got.split(b"\n\n", 2)
        assert data.startswith(b"event: data\n"), base
        assert data.count(b"\ndata:event: control\n") == PAYLOAD.count(b"event: control")
        assert control.startswith(b"event: control\ndata:{\"streamNextOffset\""), base
        assert rest == b"", base
