"""A real ``redis-server`` of our own (tests, `make cluster ENGINE=redis`), on a free
loopback port, controlled only by its PID.

``RedisServer`` starts its own process (never the system service) in its own
temporary directory, waits until it answers PING, and can pause, resume, kill and
restart it on the same port with the same arguments. ``cli`` is a blocking RESP
client over a plain socket, parsed by hiredis: an oracle independent of
``pushup.backplane.redis.client``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import hiredis

from deploy.processes import free_port

START_TIMEOUT = 10.0  # seconds for a new redis-server to answer PING
STOP_TIMEOUT = 10.0  # seconds for SIGTERM before SIGKILL


class RedisServerError(Exception):
    """redis-server would not start, or did not answer."""


def encode(args: tuple[Any, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def command(port: int, *args: Any, db: int = 0, timeout: float = 5.0) -> Any:
    """Send one command (after SELECT ``db``) on a new connection; return its reply.

    Raises ``hiredis.ReplyError`` for an error reply, OSError if nothing answers.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        wire = (encode(("SELECT", db)) if db else b"") + encode(args)
        sock.sendall(wire)
        reader = hiredis.Reader()
        replies: list[Any] = []
        while len(replies) < (2 if db else 1):
            reply = reader.gets()
            if reply is False:
                data = sock.recv(65536)
                if not data:
                    raise OSError("redis-server closed the connection")
                reader.feed(data)
                continue
            if isinstance(reply, hiredis.ReplyError):
                raise reply
            replies.append(reply)
        return replies[-1]


SOCKET_PATH_MAX = 107  # a Unix socket's path, in bytes (sun_path less its NUL)


class RedisServer:
    """One ``redis-server`` process: ``start``, ``pause``/``resume``, ``kill``, ``restart``,
    ``stop``. Without persistence arguments a restarted server is empty."""

    def __init__(self, *extra_args: str) -> None:
        self.extra_args = extra_args
        self.port = 0
        self.dir = Path(tempfile.mkdtemp(prefix="pushup-redis-"))  # short: a socket path fits
        self.unix_path = str(self.dir / "redis.sock")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RedisServerError("redis-server is not running")
        return self._process.pid

    def start(self) -> None:
        """Start on a free port (another one if the port was taken meanwhile)."""
        if shutil.which("redis-server") is None:
            raise RedisServerError("redis-server is not installed (make system-packages)")
        if len(self.unix_path.encode()) > SOCKET_PATH_MAX:  # else redis-server exits at once
            raise RedisServerError(f"the Unix socket path {self.unix_path} is longer than "
                                   f"{SOCKET_PATH_MAX} bytes: set a shorter TMPDIR")
        for _attempt in range(3):
            self.port = free_port()
            if self._spawn():
                return
        raise RedisServerError(f"redis-server did not start; log:\n{self.log_tail()}")

    def _spawn(self) -> bool:
        """Start the process on ``self.port``; True once it answers PING, False if it exited."""
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.dir),
                "--unixsocket", self.unix_path, "--unixsocketperm", "700", *self.extra_args]
        with open(self.dir / "redis.log", "ab") as log:
            # its own session: a Ctrl-C in `make cluster`'s terminal reaches the launcher only
            self._process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._process = None
                return False
            try:
                if command(self.port, "PING", timeout=1.0) == b"PONG":
                    return True
            except hiredis.ReplyError as error:
                if str(error).startswith("NOAUTH"):  # --requirepass: it answers
                    return True
            except OSError:
                pass
            time.sleep(0.01)  # polling for readiness, bounded by the deadline
        self.stop()
        raise RedisServerError(f"redis-server did not answer PING within {START_TIMEOUT}s; "
                               f"log:\n{self.log_tail()}")

    def exited(self) -> bool:
        """The process was started and has exited since (killed, crashed)."""
        return self._process is not None and self._process.poll() is not None

    def cli(self, *args: Any, db: int = 0) -> Any:
        """One command, answered synchronously (see ``command``)."""
        return command(self.port, *args, db=db)

    def pause(self) -> None:
        """SIGSTOP: connections stay open, nothing is answered."""
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, and wait for the process: connections drop, nothing is saved."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def restart(self) -> None:
        """Stop (if running) and start again with the same port, directory and arguments."""
        self.stop(keep_dir=True)
        if not self._spawn():
            raise RedisServerError(f"redis-server did not restart on port {self.port}; "
                                   f"log:\n{self.log_tail()}")

    def stop(self, keep_dir: bool = False) -> None:
        """SIGTERM (SIGKILL after STOP_TIMEOUT); then remove the directory unless kept."""
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
                process.send_signal(signal.SIGCONT)  # a paused server must wake to exit
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if not keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = (self.dir / "redis.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
