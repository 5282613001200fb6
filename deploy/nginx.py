"""Render deploy/nginx-pushup.conf.template, and run nginx with it for tests.

This module holds the nginx front's two moves: turning the template into a
site file for given nodes and certificate, and starting a private nginx
(its own prefix in a temporary directory, foreground, stopped by PID) that
includes it. It never touches a system nginx or its configuration.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITE_TEMPLATE = HERE / "nginx-pushup.conf.template"
NGINX = "/usr/sbin/nginx"

MAIN = """daemon off;
master_process on;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {prefix}/pushup.conf;
}}
"""


def site_config(listen: str, node_addresses: Sequence[str], certificate: str,
                certificate_key: str) -> str:
    """The site file for these nodes ("HOST:PORT" each) and certificate."""
    servers = "\n".join(f"    server {a} max_fails=1 fail_timeout=5s;" for a in node_addresses)
    values = {"listen": listen, "servers": servers, "certificate": certificate,
              "certificate_key": certificate_key}
    site = SITE_TEMPLATE.read_text()
    for name, value in values.items():
        site = site.replace("{{" + name + "}}", value)
    return site


def read_timeout_seconds(site: str) -> float:
    """``proxy_read_timeout`` of a site file, in seconds (nginx's "150s", "2m")."""
    found = re.search(r"^\s*proxy_read_timeout\s+(\d+)(ms|s|m|h)?\s*;", site, re.MULTILINE)
    if found is None:
        return 60.0  # nginx's default
    unit = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[found.group(2)]
    return int(found.group(1)) * unit


class PrivateNginx:
    """nginx on ``listen`` in front of ``node_addresses``, TLS with the given
    certificate: ``start()`` returns once it accepts connections."""

    def __init__(self, listen: str, node_addresses: Sequence[str], certificate: str,
                 certificate_key: str) -> None:
        self.listen = listen
        self.prefix = Path(tempfile.mkdtemp(prefix="pushup-nginx-"))
        (self.prefix / "pushup.conf").write_text(
            site_config(listen, node_addresses, certificate, certificate_key))
        (self.prefix / "nginx.conf").write_text(MAIN.format(prefix=self.prefix))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> None:
        import socket

        host, port = self.listen.rsplit(":", 1)
        self.process = subprocess.Popen(
            [NGINX, "-c", str(self.prefix / "nginx.conf"), "-p", f"{self.prefix}/"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.error_log()}")
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)  # bounded by the deadline
        raise TimeoutError(f"nginx did not listen on {self.listen}: {self.error_log()}")

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.prefix, ignore_errors=True)
