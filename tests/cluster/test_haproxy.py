"""HAProxy's front-end role and several HAProxy processes on one port."""
from __future__ import annotations

import http.server
import threading

import psutil

from tests.cluster.clients import jrequest, publish, request, uniq


class WebApp(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"<h1>the web application</h1>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_front_sends_pushup_paths_to_pushup_and_the_rest_to_the_web_backend(fresh_cluster):
    app = http.server.ThreadingHTTPServer(("127.0.0.1", 0), WebApp)
    threading.Thread(target=app.serve_forever, daemon=True).start()
    try:
        c = fresh_cluster(2, haproxy=True, web_backend=f"127.0.0.1:{app.server_port}")
        status, _, body = request("GET", c.front_url + "/about/index.html")
        assert (status, body) == (200, b"<h1>the web application</h1>")
        assert publish(c.front_url, [uniq()], "via the front")["id"]
        status, health = jrequest("GET", c.front_url + "/health")
        assert status == 200 and health["status"] == "ok"
    finally:
        app.shutdown()


def test_two_haproxy_processes_share_the_front_port(fresh_cluster):
    c = fresh_cluster(2, haproxy=True, haproxy_procs=2)
    listening = {conn.pid for conn in psutil.net_connections("tcp")
                 if conn.status == psutil.CONN_LISTEN and conn.laddr.port == c.front_port}
    assert listening == {p.pid for p in c.haproxies}
    assert len(listening) == 2
    for _ in range(20):
        assert publish(c.front_url, [uniq()], 1)["id"]
