"""SIGTERM on a clustered node whose peer is down, with a client that does not read.

The port must close at once (before the node spends its bounded time trying
to hand the peer what it lacks), and the process must exit 0 by itself.
"""
from __future__ import annotations

import signal
import socket
import time

from tests.e2e.support import free_port, spawn, uniq, wait_until


def connect_refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_with_a_peer_down_closes_the_port_at_once_and_exits_0():
    dead_peer = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    n = spawn("--cluster-secret", "s3cret", "--peer", dead_peer)
    try:
        # Messages the dead peer never confirms, and a client that asks for
        # ~6 MB of them and then reads nothing: the drain must not wait on either.
        ch = uniq("drain")
        blob = "x" * 60_000
        for _ in range(7):
            r = n.publish_batch([{"channels": [ch], "data": blob} for _ in range(16)])
            assert r.status == 202, r  # its only peer is down: stored here only
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.connect(("127.0.0.1", n.port))
        slow.sendall(f"GET {n.sub_path([ch], since='0', limit=1000)} HTTP/1.1\r\n"
                     f"Host: x\r\n\r\n".encode())
        wait_until(lambda: n.stats()["bytes_out"] > 1_000_000, 10,
                   msg="the big answer is being written")

        t0 = time.monotonic()
        n.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: connect_refused(n.port), timeout=10, interval=0.01,
                   msg="the listening port is closed")
        closed = time.monotonic() - t0
        # The port closed before the node gave up on the dead peer: that
        # warning, which ends the bounded flush, is not out yet.
        assert n.proc.poll() is None
        assert not any("not yet confirmed" in line for line in n.stderr_lines), n.stderr_lines
        rc = n.proc.wait(15)  # hang guard
        exited = time.monotonic() - t0
        print(f"\nSIGTERM with a peer down: port refused after {closed:.3f} s, "
              f"exit {rc} after {exited:.3f} s")
        assert rc == 0, n.stderr_lines[-10:]
        assert any("not yet confirmed" in line for line in n.stderr_lines), n.stderr_lines
        slow.close()
    finally:
        if n.proc.poll() is None:
            n.proc.kill()
            n.proc.wait(5)
