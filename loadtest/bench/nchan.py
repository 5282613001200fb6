"""nginx + nchan as a server under test, beside PushUp, in the same harness.

Rule: this harness starts its own nginx and never touches the system's. It
renders `nchan.conf.template` into a fresh temporary prefix directory, runs
`nginx -c <that conf> -p <that dir>` in the foreground (`daemon off; master_process
on; worker_processes 1;`) on a free loopback port, and stops it by PID (SIGTERM
to the master, then SIGKILL to any of its processes left); the directory is
removed afterwards. A Debian `nginx` service, if one runs, is neither used nor
stopped.

nginx and the module come from Debian (`nginx`, `libnginx-mod-nchan`); `make
bench-packages` installs them. Without them `NchanMissing` says so.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from deploy.processes import free_port

from . import procfs
from .server import Server, ServerError, raise_nofile

TEMPLATE = Path(__file__).with_name("nchan.conf.template")
MODULE = Path("/usr/lib/nginx/modules/ngx_nchan_module.so")
INSTALL_HINT = "run `make bench-packages` (apt-get install nginx libnginx-mod-nchan)"


class NchanMissing(ServerError):
    pass


def nginx_binary() -> str:
    """The nginx executable, or NchanMissing when nginx or the nchan module is absent."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK)
                                      else None)
    if found is None:
        raise NchanMissing(f"nginx is not installed; {INSTALL_HINT}")
    if not MODULE.is_file():
        raise NchanMissing(f"the nchan module {MODULE} is not installed; {INSTALL_HINT}")
    return found


def render(port: int, prefix: Path, error_log: Path, hold_timeout: int,
           module: Path = MODULE) -> str:
    """The template with its {{placeholders}} filled in."""
    values = {"port": str(port), "prefix": str(prefix), "error_log": str(error_log),
              "hold_timeout": str(hold_timeout), "module": str(module),
              "nofile": str(raise_nofile())}
    text = TEMPLATE.read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    left = re.findall(r"{{\w+}}", text)
    if left:
        raise ValueError(f"unfilled placeholders in {TEMPLATE.name}: {left}")
    return text


# nchan_stub_status lines -> the /stats keys the scenarios read.
STUB_KEYS = {"subscribers": "waiting", "total published messages": "published",
             "stored messages": "messages", "channels": "channels"}


def parse_stub_status(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in STUB_KEYS:
            out[STUB_KEYS[key.strip()]] = int(value.strip())
    missing = set(STUB_KEYS.values()) - out.keys()
    if missing:
        raise ServerError(f"nchan_stub_status lacks {sorted(missing)}: {text!r}")
    return out


class NchanServer(Server):
    """nginx (master + 1 worker) with nchan, on a free loopback port."""

    dialect = "nchan"

    def __init__(self, log_path: Path, out_dir: Path, hold_timeout: int) -> None:
        super().__init__([nginx_binary()], log_path, out_dir)
        self.hold_timeout = hold_timeout
        self.prefix: Path | None = None

    def start(self, timeout: float = 30.0) -> None:
        for _attempt in range(3):
            try:
                self.prefix = Path(tempfile.mkdtemp(prefix="bench-nchan-"))
                self.port = free_port()
                conf = self.prefix / "nginx.conf"
                conf.write_text(render(self.port, self.prefix, self.log_path, self.hold_timeout))
                self.command = [self.command[0], "-c", str(conf), "-p", f"{self.prefix}/"]
                self.spawn(subprocess.DEVNULL)
                if self._await_ready(timeout):
                    self.serving()
                    return
            except BaseException:
                self.stop()
                raise
            self.stop()  # exited at once (a lost race for the port): try another
        raise ServerError(f"nginx did not start; log tail:\n{self.log_tail()}")

    def _await_ready(self, timeout: float) -> bool:
        """Poll /status until nginx answers and its worker runs; False if nginx exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                return False
            try:
                self.stats()
            except (OSError, ServerError):
                time.sleep(0.05)
                continue
            if len(procfs.descendants(self.pid)) >= 2:  # the master and its worker
                return True
            time.sleep(0.05)
        raise ServerError(f"nginx did not answer within {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self, grace: float = 10.0) -> int | None:
        code = super().stop(grace)
        if self.prefix is not None:
            shutil.rmtree(self.prefix, ignore_errors=True)
            self.prefix = None
        return code

    def stats(self) -> dict[str, Any]:
        status, text = self.request("GET", "/status")
        if status != 200 or not isinstance(text, str):
            raise ServerError(f"/status answered {status}: {text!r}")
        return parse_stub_status(text)

    def publish(self, channel: str, data: Any) -> tuple[bool, Any]:
        status, doc = self.request("POST", f"/pub?channel={channel}", data)
        return status in (201, 202), doc

    def warm_up(self) -> None:
        """Publish and fetch a few messages, as Server.warm_up does for PushUp."""
        self.stats()
        for i in range(3):
            ok, doc = self.publish("bench-warm", {"warm": i})
            if not ok:
                raise ServerError(f"warm-up publish refused: {doc!r}")
            self.request("GET", "/sub?channel=bench-warm")  # the oldest: answered at once
