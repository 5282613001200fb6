"""SIGTERM ends a Durable Stream's SSE response at once, as it does /subscribe's:
the node drains without waiting out its drain limit, and exits 0."""

from __future__ import annotations

import signal

from tests.e2e.support import uniq


def test_sigterm_ends_an_open_durable_stream_sse_response(start_node):
    node = start_node()
    path = f"/v1/stream/{uniq('drain')}"
    created = node.request("PUT", path, raw_body=b"x", headers={"Content-Type": "text/plain"})
    assert created.status == 201
    sse = node.raw_socket(timeout=15)  # hang guard
    try:
        sse.sendall(f"GET {path}?offset=-1&live=sse HTTP/1.1\r\nHost: t\r\n\r\n".encode())
        seen = b""
        while b'"upToDate":true' not in seen:  # its first control event: it is held now
            chunk = sse.recv(65536)
            assert chunk, f"the stream ended early: {seen!r}"
            seen += chunk
        node.proc.send_signal(signal.SIGTERM)
        while chunk := sse.recv(65536):
            seen += chunk  # read to the end: the node ends the response
    finally:
        sse.close()
    assert seen.endswith(b"0\r\n\r\n")  # the last chunk: ended, not cut
    assert node.proc.wait(15) == 0  # hang guard
    assert not [line for line in node.stderr_lines if "did not read their answers" in line]
