"""HAProxy's front-end role and several HAProxy processes on one port."""
from __future__ import annotations

import http.client
import http.server
import threading

import psutil

from tests.cluster.clients import jrequest, publish, request, uniq


class WebApp(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server's name
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


def test_balance_by_channel_keeps_a_channels_subscribes_on_one_node_and_spreads_the_rest(
        fresh_cluster):
    c = fresh_cluster(3, haproxy=True, balance="channel")

    def node_of(method: str, path: str, body: bytes | None = None) -> str:
        status, headers, _ = request(method, c.front_url + path, body)
        assert status in (200, 201), (status, path)
        return headers["x-pushup-node"]

    channels = [uniq(f"affine{k}") for k in range(12)]
    # each request on a new connection: only the channel decides the node
    homes = {ch: {node_of("GET", f"/subscribe?channels={ch}&timeout=0") for _ in range(4)}
             for ch in channels}
    assert all(len(nodes) == 1 for nodes in homes.values()), homes
    assert len({next(iter(nodes)) for nodes in homes.values()}) > 1  # channels spread
    # publishes go round robin, whatever their channel
    publish_body = b'{"channels":["%s"],"data":1}' % channels[0].encode()
    assert len({node_of("POST", "/publish", publish_body) for _ in range(6)}) == 3


def test_balance_by_channel_gives_each_node_its_share_of_channels_within_a_few_percent(
        fresh_cluster):
    """With HAProxy's default weight a server has 16 points on the hash ring, and
    the busier of two nodes held 12 % over its share of these 600 channels (the
    names are fixed, and so is the ring: the figure is the same every run)."""
    c = fresh_cluster(2, haproxy=True, balance="channel")
    conn = http.client.HTTPConnection("127.0.0.1", c.front_port, timeout=10)
    held: dict[str, int] = {}
    for k in range(600):
        conn.request("GET", f"/subscribe?channels=user-{k}&timeout=0")
        response = conn.getresponse()
        response.read()
        assert response.status == 200
        node = response.getheader("X-PushUp-Node")
        held[node] = held.get(node, 0) + 1
    conn.close()
    assert len(held) == 2 and max(held.values()) <= 1.05 * 300, held


def test_balance_sticky_keeps_a_keep_alive_clients_requests_on_one_node_and_spreads_clients(
        fresh_cluster):
    c = fresh_cluster(3, haproxy=True, balance="sticky")
    clients = [http.client.HTTPConnection("127.0.0.1", c.front_port, timeout=10)
               for _ in range(6)]
    try:
        homes = []
        for k, conn in enumerate(clients):  # every connection stays open: leastconn spreads
            nodes = set()
            for _ in range(5):  # polls on other channels each time: no affinity by channel
                conn.request("GET", f"/subscribe?channels={uniq(f'sticky{k}')}&timeout=0")
                resp = conn.getresponse()
                resp.read()
                assert resp.status == 200
                nodes.add(resp.getheader("X-PushUp-Node"))
            homes.append(nodes)
        assert all(len(nodes) == 1 for nodes in homes), homes
        assert len({next(iter(nodes)) for nodes in homes}) == 3, homes
    finally:
        for conn in clients:
            conn.close()
