"""HTTP/2 at the front: the shipped nginx TLS site and HAProxy's TLS variant
(``alpn h2,http/1.1``) serve long polls and event streams over h2, and an event
goes through every shipped front as the node writes it.

Real parts: two mesh nodes, HAProxy from deploy/launch.py with its self-signed
certificate (openssl), a private nginx (deploy/nginx.py) with the same
certificate, curl ``--http2`` and Debian's headless Chromium. The browser opens
more event streams than HTTP/1.1 allows it connections to one origin (6), in
several tabs: over HTTP/1.1 the streams past the sixth would wait for a free
connection and never receive; over h2 they share one connection and all do.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.launch import LocalCluster, haproxy_config, listening_ports
from deploy.nginx import PrivateNginx
from tests.chromium import chrome
from tests.cluster.clients import jrequest, peers_idle, publish, uniq
from tests.toolkit import free_port, wait_until

# one worker runs them all, on one cluster (they share the module's fixture)
pytestmark = pytest.mark.xdist_group("h2_fronts")

TABS = 3
STREAMS_PER_TAB = 4  # 12 in all: past HTTP/1.1's 6 connections per origin


class Fronts:
    """Two nodes, behind HAProxy (TLS, h2) and nginx (TLS, h2) at once."""

    def __init__(self, cluster: LocalCluster, nginx_port: int) -> None:
        self.cluster = cluster
        self.bases = [cluster.node_url(i) for i in range(2)]
        self.ports = {"haproxy": cluster.front_port, "nginx": nginx_port}
        self.certificate = cluster.certificate


@pytest.fixture(scope="module")
def fronts() -> Iterator[Fronts]:
    with LocalCluster(nodes=2, haproxy=True, tls=True) as cluster:
        bases = [cluster.node_url(i) for i in range(2)]
        wait_until(lambda: peers_idle(bases), 20, 0.1, "every peer link up")
        port = free_port()
        nginx = PrivateNginx(f"127.0.0.1:{port}", [b.removeprefix("http://") for b in bases],
                             cluster.certificate, cluster.certificate)
        nginx.start()
        try:
            yield Fronts(cluster, port)
        finally:
            nginx.stop()


def held_on(bases: list[str], channel: str) -> int:
    """Subscriptions the nodes hold on ``channel`` (GET /channels/{name})."""
    held = 0
    for base in bases:
        status, body = jrequest("GET", f"{base}/channels/{channel}")
        held += body.get("subscribers", 0) if status == 200 else 0
    return held


def curl(fronts: Fronts, front: str, path: str, *flags: str) -> subprocess.Popen[bytes]:
    """curl over HTTP/2 only (``--http2`` falls back to 1.1 where ALPN says so:
    the status line it prints says which was spoken), the response head included."""
    url = f"https://127.0.0.1:{fronts.ports[front]}{path}"
    return subprocess.Popen(["curl", "--http2", "-sS", "-i", "-N", "--max-time", "30",
                             "--cacert", fronts.certificate, *flags, url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("front", ["haproxy", "nginx"])
def test_a_long_poll_over_http2_is_held_and_answered_with_the_publish(fronts, front):
    ch = uniq("h2poll")
    poll = curl(fronts, front, f"/subscribe?channels={ch}&timeout=25")
    try:
        # held by a node, through the front, over h2
        wait_until(lambda: held_on(fronts.bases, ch) == 1, 15, 0.05, "the poll is held")
        publish(fronts.bases[0], [ch], "over h2")
        out, err = poll.communicate(timeout=20)  # hang guard
    finally:
        if poll.poll() is None:
            poll.kill()
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/2 200"), (head, err)
    assert b'"over h2"' in body and b'"cursor"' in body


@pytest.mark.parametrize("front", ["haproxy", "nginx"])
def test_an_event_stream_over_http2_delivers_each_publish_as_it_happens(fronts, front):
    ch = uniq("h2sse")
    stream = curl(fronts, front, f"/subscribe?channels={ch}", "-H",
                  "Accept: text/event-stream")
    assert stream.stdout is not None
    try:
        seen = b""
        while b"event: cursor" not in seen:  # the head and the position: it is open
            line = stream.stdout.readline()
            assert line, (seen, stream.stderr.read() if stream.stderr else b"")
            seen += line
        assert seen.startswith(b"HTTP/2 200"), seen
        assert b"content-type: text/event-stream" in seen.lower()
        for n in range(3):  # each one before the next is published
            publish(fronts.bases[n % 2], [ch], f"event {n}")
            while f'"event {n}"'.encode() not in seen:
                line = stream.stdout.readline()  # curl's --max-time is the hang guard
                assert line, seen
                seen += line
    finally:
        stream.kill()
        stream.wait()


def tcp_connections_to(port: int, pid: int) -> int:
    """Established TCP connections that ``pid``'s process tree holds to ``port``
    (the browser's network service is a child process of its own)."""
    pids = {pid}
    for _ in range(3):  # children, grandchildren
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                if ppid in pids:
                    pids.add(int(p.name))
    inodes: set[str] = set()
    for p in pids:
        try:
            for fd in Path(f"/proc/{p}/fd").iterdir():
                target = str(fd.readlink()) if fd.is_symlink() else ""
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].rsplit(":", 1)[1], 16)
        if fields[3] == "01" and remote_port == port and fields[9] in inodes:  # ESTABLISHED
            count += 1
    return count


TAB_SCRIPT = """
window.got = {};
window.open_streams = 0;
for (const ch of arguments[0]) {
  window.got[ch] = [];
  const source = new EventSource('/subscribe?channels=' + encodeURIComponent(ch));
  source.addEventListener('cursor', () => { window.open_streams += 1; }, {once: true});
  source.onmessage = (e) => window.got[ch].push(JSON.parse(e.data).data);
}
"""


@pytest.mark.parametrize("front", ["haproxy", "nginx"])
def test_chromium_holds_streams_on_many_channels_in_several_tabs_over_one_connection(
        fronts, front):
    origin = f"https://127.0.0.1:{fronts.ports[front]}"
    # our own self-signed certificate: the browser is told to take it
    driver = chrome("--ignore-certificate-errors")
    # hang guard: over HTTP/1.1 a tab's page waits for one of the 6 connections
    # the streams already hold
    driver.set_page_load_timeout(15)
    channels = [[uniq(f"tab{t}-") for _ in range(STREAMS_PER_TAB)] for t in range(TABS)]
    try:
        tabs = []
        for t in range(TABS):
            if t:
                driver.switch_to.new_window("tab")
            driver.get(origin + "/health")  # a page of the front's origin: no CORS
            assert driver.execute_script(
                "return performance.getEntriesByType('navigation')[0].nextHopProtocol") == "h2"
            driver.execute_script(TAB_SCRIPT, channels[t])
            tabs.append(driver.current_window_handle)
        for tab in tabs:  # every stream has its position (event: cursor): it is open
            driver.switch_to.window(tab)
            wait_until(lambda: driver.execute_script("return window.open_streams") ==
                       STREAMS_PER_TAB, 20, 0.1, f"every stream of tab {tab} is open")
        for names in channels:
            for ch in names:
                publish(fronts.bases[0], [ch], f"to {ch}")
        for tab, names in zip(tabs, channels, strict=True):
            driver.switch_to.window(tab)
            wait_until(lambda names=names: driver.execute_script(
                "return arguments[0].every(ch => window.got[ch].length === 1)", names),
                15, 0.1, f"every stream of tab {tab} has its message")
            assert driver.execute_script("return window.got") == {
                ch: [f"to {ch}"] for ch in names}
        # one connection carries all of them (measured: 1; a browser may open a spare)
        browser_pid = driver.service.process.pid
        assert 1 <= tcp_connections_to(fronts.ports[front], browser_pid) <= 2
    finally:
        driver.quit()


def plain_haproxy(workdir: Path, node_ports: list[int]) -> tuple[subprocess.Popen[bytes], int]:
    """The shipped HAProxy configuration, plain HTTP/1.1, in front of the nodes."""
    port = free_port()
    config = workdir / "haproxy-plain.cfg"
    config.write_text(haproxy_config(port, node_ports))
    proc = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    wait_until(lambda: port in listening_ports(proc.pid), 15, 0.05, "haproxy listens")
    return proc, port


def test_an_event_through_the_shipped_haproxy_is_not_held_back_by_the_kernel(fronts):
    """Without ``option http-no-delay`` HAProxy sends an unfinished response's chunk
    with MSG_MORE and the kernel holds it for its 200 ms cork timer, every event
    (measured: 208-216 ms, against 1 ms straight). The fastest of ten events is
    taken, so a busy machine's slowness does not make it flake."""
    proc, port = plain_haproxy(fronts.cluster.workdir, fronts.cluster.node_ports)
    try:
        ch = uniq("nodelay")
        sock = socket.create_connection(("127.0.0.1", port), timeout=15)  # hang guard
        sock.sendall(f"GET /subscribe?channels={ch} HTTP/1.1\r\nHost: x\r\n"
                     "Accept: text/event-stream\r\n\r\n".encode())
        seen = b""
        while b"event: cursor" not in seen:
            seen += sock.recv(65536)
        took = []
        for n in range(10):
            sent = time.monotonic()
            publish(fronts.bases[n % 2], [ch], f"event {n}")
            while f'"event {n}"'.encode() not in seen:
                seen += sock.recv(65536)
            took.append(time.monotonic() - sent)
        sock.close()
    finally:
        proc.terminate()
        proc.wait(10)
    assert min(took) < 0.1, took
