"""deploy/grafana-dashboard.json against a real Prometheus (Debian's package,
run by PID with a config and storage of its own) scraping two real peered
nodes on their admin ports under light load: every panel's query returns data,
and the request duration panel draws no empty series (an endpoint with no timed
request in the window, as held polls are not timed, gives no line, not a NaN one).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.toolkit import free_port

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"
PROMETHEUS = "/usr/bin/prometheus"
DEADLINE = 25.0
SECRET = "dashboard-test-cluster-secret"


def get(url: str, body: bytes | None = None, timeout: float = 10) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={
        "Content-Type": "application/json", "Connection": "close"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel["targets"]]


@pytest.fixture
def nodes(serve) -> list[tuple[str, int]]:
    """Two peered nodes: (client URL, admin port) each."""
    ports = [free_port() for _ in range(2)]
    admins = [free_port() for _ in range(2)]
    for i in range(2):
        serve("--admin-port", str(admins[i]), "--peer", f"http://127.0.0.1:{ports[1 - i]}",
              port=ports[i], env={"PUSHUP_CLUSTER_SECRET": SECRET})
    return [(f"http://127.0.0.1:{p}", a) for p, a in zip(ports, admins, strict=True)]


@pytest.fixture
def prometheus(tmp_path, nodes) -> Iterator[str]:
    assert shutil.which(PROMETHEUS) or os.path.exists(PROMETHEUS), \
        "Debian's prometheus is not installed (make system-packages)"
    port = free_port()
    targets = ", ".join(f'"127.0.0.1:{admin}"' for _, admin in nodes)
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      "scrape_configs:\n  - job_name: pushup\n    static_configs:\n"
                      f"      - targets: [{targets}]\n")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "prometheus.log", "wb"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                if get(url + "/-/ready", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus not ready"
            time.sleep(0.1)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)


class Load(threading.Thread):
    """Light traffic on both nodes: a held subscriber answered by each publish
    (delivery lag), publishes (some with bad JSON: errors by code)."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls = urls
        self.stop = threading.Event()
        self.published = 0

    def run(self) -> None:
        poller = threading.Thread(target=self.poll, daemon=True)
        poller.start()
        i = 0
        while not self.stop.is_set():
            url = self.urls[i % 2]
            body = b"{bad" if i % 10 == 9 else b'{"channels":["load"],"data":%d}' % i
            if get(url + "/publish", body)[0] == 201:
                self.published += 1
            i += 1
            self.stop.wait(0.05)
        poller.join(10)

    def poll(self) -> None:
        cursor = ""
        while not self.stop.is_set():
            query = urllib.parse.urlencode({"channels": "load", "timeout": "2",
                                            **({"since": cursor} if cursor else {})})
            status, body = get(f"{self.urls[0]}/subscribe?{query}")
            if status == 200:
                cursor = json.loads(body)["cursor"]


def test_every_dashboard_panel_returns_data_from_a_real_prometheus(nodes, prometheus):
    load = Load([url for url, _ in nodes])
    load.start()
    try:
        missing = queries()
        assert len(missing) >= 10
        deadline = time.monotonic() + DEADLINE
        while missing:
            assert time.monotonic() < deadline, f"no data for: {missing}"
            time.sleep(0.5)
            missing = [(title, expr) for title, expr in missing
                       if not has_data(prometheus, expr)]
    finally:
        load.stop.set()
        load.join(15)
    assert load.published > 0


def test_the_duration_panel_draws_a_line_only_for_endpoints_timed_in_the_window(
        nodes, prometheus):
    """Every endpoint has its histogram from the start; under this load nothing
    asks for /channels (nor /health, nor an unknown path): a line each for what
    was timed, all finite, none for the rest."""
    load = Load([url for url, _ in nodes])
    load.start()
    try:
        expr = dict(queries())["Request duration p99 by endpoint"]
        deadline = time.monotonic() + DEADLINE
        while not has_data(prometheus, expr):
            assert time.monotonic() < deadline, f"no data for {expr}"
            time.sleep(0.5)
        result = answer(prometheus, expr)
    finally:
        load.stop.set()
        load.join(15)
    assert result and all(math.isfinite(float(r["value"][1])) for r in result), result
    assert "channels" not in {r["metric"]["endpoint"] for r in result}, result


def answer(prometheus: str, expr: str) -> list[dict]:
    status, body = get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    found = json.loads(body)
    assert status == 200 and found["status"] == "success", (expr, found)
    return found["data"]["result"]


def has_data(prometheus: str, expr: str) -> bool:
    """The query answers a vector with at least one finite value."""
    status, body = get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "success", (expr, answer)
    return any(math.isfinite(float(r["value"][1])) for r in answer["data"]["result"])
