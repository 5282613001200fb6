"""The parts the conformance tests drive: a restartable `pushup serve` on one port
and data directory, a relay that can hold clients back and end their streams
cleanly, and third-party clients run as processes printing one JSON line per
message (tests/conformance/clients/). Ports and waits are tests/toolkit.py's.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.toolkit import ServedNode, free_port, wait_healthy, wait_until

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = Path(__file__).resolve().parent / "clients"
MESSAGES = int(os.environ.get("PUSHUP_CONFORMANCE_MESSAGES", "10"))
RESTARTS = int(os.environ.get("PUSHUP_CONFORMANCE_RESTARTS", "1"))
GUARD = 30.0  # hang guard for anything a test awaits (never a timing assertion)


# -- a node ----------------------------------------------------------------------

class RestartableNode:
    """`pushup serve` on one port and one data directory, restartable (each start
    is a toolkit ``ServedNode``: stopped by PID, SIGTERM, exit 0 expected)."""

    def __init__(self, *flags: str) -> None:
        self.port = free_port()
        self.data_dir = tempfile.mkdtemp(prefix="pushup-conformance-")
        self.flags = flags
        self.process: ServedNode | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = ServedNode("--host", "127.0.0.1", "--data-dir", self.data_dir,
                                  *self.flags, port=self.port)
        wait_healthy(self.url, time.monotonic() + GUARD, self.process.proc)

    def stop(self) -> None:
        """SIGTERM by PID; the node must drain and exit 0."""
        process, self.process = self.process, None
        if process is None:
            return
        code = process.stop(timeout=GUARD)
        process.log.unlink(missing_ok=True)
        assert code == 0, f"the node exited {code} after SIGTERM"

    def restart(self) -> None:
        self.stop()
        self.start()

    def publish(self, channel: str, data: Any) -> None:
        body = json.dumps({"channels": [channel], "data": data}).encode()
        request = urllib.request.Request(self.url + "/publish", body, method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 201, response.status

    def subscribers(self, channel: str) -> int:
        try:
            with urllib.request.urlopen(
                    f"{self.url}/channels/{urllib.parse.quote(channel, safe='')}",
                    timeout=10) as response:
                return int(json.loads(response.read())["subscribers"])
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return 0
            raise

    def wait_subscribers(self, channel: str, n: int) -> None:
        wait_until(lambda: self.subscribers(channel) == n, GUARD,
                   msg=f"{n} subscriber(s) held on {channel!r}")


# -- the relay -------------------------------------------------------------------

class _Pair:
    """One client connection relayed to the node. Server-to-client bytes of a
    chunked response are forwarded whole chunks at a time, so the relay can end the
    response cleanly (the last chunk) at any moment."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.lock = threading.Lock()
        self.head = b""  # the first response's head, once complete
        self.chunked = False
        self.pending = b""  # server bytes not yet forwarded (an incomplete chunk)
        self.forwarded = b""  # body bytes forwarded to the client so far
        self.ended = False

    def from_server(self, data: bytes) -> None:
        with self.lock:
            if self.ended:
                return
            self.pending += data
            if not self.head:
                head, sep, rest = self.pending.partition(b"\r\n\r\n")
                if not sep:
                    return
                self.head = head + sep
                self.chunked = b"transfer-encoding: chunked" in head.lower()
                self.client.sendall(self.head)
                self.pending = rest
            if not self.chunked:
                self.client.sendall(self.pending)
                self.forwarded += self.pending
                self.pending = b""
                return
            while b"\r\n" in self.pending:
                size_line, _, rest = self.pending.partition(b"\r\n")
                size = int(size_line.split(b";")[0], 16)
                if len(rest) < size + 2:
                    return
                whole = len(size_line) + 2 + size + 2
                self.client.sendall(self.pending[:whole])
                self.forwarded += rest[:size]
                self.pending = self.pending[whole:]

    def end(self) -> None:
        """End the response cleanly (its last chunk, if chunked) and close both sides."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
            try:
                if self.chunked:
                    self.client.sendall(b"0\r\n\r\n")
                self.client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.client.close()
            self.upstream.close()


class Relay:
    """A TCP relay in front of one port: ``cut()`` ends every open response and
    holds new connections back (in the listen backlog) until ``release()``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.pairs: list[_Pair] = []
        self.open = threading.Event()
        self.open.set()
        self.gate = threading.Lock()  # held while accepting, so cut() never races it
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.stopped:
            self.open.wait()
            with self.gate:
                if not self.open.is_set() or self.stopped:
                    continue
                try:
                    client, _ = self.listener.accept()
                except (TimeoutError, OSError):
                    continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            pair = _Pair(client, upstream)
            self.pairs.append(pair)
            threading.Thread(target=self._pump_up, args=(pair,), daemon=True).start()
            threading.Thread(target=self._pump_down, args=(pair,), daemon=True).start()

    @staticmethod
    def _pump_up(pair: _Pair) -> None:
        try:
            while data := pair.client.recv(65536):
                pair.upstream.sendall(data)
        except OSError:
            pass
        pair.end()

    @staticmethod
    def _pump_down(pair: _Pair) -> None:
        try:
            while data := pair.upstream.recv(65536):
                pair.from_server(data)
        except OSError:
            pass
        pair.end()

    def opened_streams(self) -> list[bytes]:
        """The body bytes forwarded so far on each connection still open."""
        return [pair.forwarded for pair in self.pairs if not pair.ended]

    def cut(self) -> None:
        """End every open response now; hold new connections until release()."""
        with self.gate:
            self.open.clear()
        for pair in list(self.pairs):
            pair.end()

    def release(self) -> None:
        self.open.set()

    def close(self) -> None:
        self.stopped = True
        self.open.set()
        self.cut()
        self.listener.close()


# -- clients ---------------------------------------------------------------------

def client_argv(name: str, base: str, channel: str) -> list[str]:
    """The command that runs client ``name`` on ``channel`` from ``since=now``."""
    stream = f"{base}/subscribe?channels={urllib.parse.quote(channel, safe='')}&since=now"
    node = shutil.which("node")
    assert node is not None, "node is not installed: `make setup` installs nodejs"
    return {
        "eventsource": [node, str(CLIENTS / "eventsource.mjs"), stream],
        "httpx-sse": [sys.executable, str(CLIENTS / "httpx_sse_client.py"), stream],
        "aiohttp-sse-client": [sys.executable, str(CLIENTS / "aiohttp_sse_client_client.py"),
                               stream],
        "sseclient-py": [sys.executable, str(CLIENTS / "sseclient_py_client.py"), stream],
        "long-poll-requests": [sys.executable, str(CLIENTS / "longpoll_requests_client.py"),
                               base, channel],
        "long-poll-fetch": [node, str(CLIENTS / "longpoll-fetch.mjs"), base, channel],
    }[name]


STREAM_CLIENTS = ["eventsource", "httpx-sse", "aiohttp-sse-client", "sseclient-py"]
POLL_CLIENTS = ["long-poll-requests", "long-poll-fetch"]


class ClientProcess:
    """A client process; ``lines`` fills with what it printed (JSON lines)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, cwd=CLIENTS)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.received: list[dict[str, Any]] = []  # messages and gaps, in order
        self.errors: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(json.loads(raw))

    def data(self) -> list[Any]:
        """The data of every message received so far (gaps as the string 'GAP')."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line["kind"] == "error":
                self.errors.append(line.get("message", ""))
            else:
                self.received.append(line)
        return [line["data"] if line["kind"] == "message" else "GAP" for line in self.received]

    def wait_for_data(self, last: Any) -> list[Any]:
        """Everything received up to and including the message ``last`` (hang guard)."""
        try:
            wait_until(lambda: last in self.data() or self.proc.poll() is not None, GUARD,
                       msg=f"message {last!r} at the client")
        except AssertionError:
            raise AssertionError(f"{self.data()} received, not {last!r}; "
                                 f"client errors {self.errors[-3:]}") from None
        assert self.proc.poll() is None, f"the client exited: {self.stderr()}"
        return self.data()

    def stderr(self) -> str:
        self.proc.kill()
        assert self.proc.stderr is not None
        return self.proc.stderr.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
