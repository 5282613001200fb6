"""pushup/ops/admin.py, ``--admin-port``, on real nodes: /stats and /metrics leave the client port
for a loopback one, and with ``--workers`` one scrape there sums every
worker's histograms."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.toolkit import free_port, wait_until

DEADLINE = 20.0


def get(url: str, body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={
        "Content-Type": "application/json", "Connection": "close"})
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def figures(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples}


def test_the_figures_move_to_the_admin_port(serve):
    admin = free_port()
    url = serve("--admin-port", str(admin)).url
    admin_url = f"http://127.0.0.1:{admin}"
    for path in ("/stats", "/metrics"):
        status, body = get(url + path)
        assert status == 404 and json.loads(body)["error"]["code"] == "not_found", body
    assert get(url + "/health")[0] == 200
    assert get(url + "/publish", b'{"channels":["a"],"data":1}')[0] == 201
    status, body = get(admin_url + "/metrics")
    assert status == 200
    assert figures(body)[("pushup_publish_latency_seconds_count", ())] == 1
    status, body = get(admin_url + "/stats")
    assert status == 200 and json.loads(body)["published"] == 1
    assert get(admin_url + "/health")[0] == 200
    status, body = get(admin_url + "/publish", b'{"channels":["a"],"data":1}')
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"


def test_with_workers_one_scrape_of_the_admin_port_sums_every_workers_histograms(serve):
    admin = free_port()
    url = serve("--workers", "2", "--admin-port", str(admin)).url
    publishes = 20
    for i in range(publishes):  # a new connection each: the kernel spreads them
        assert get(url + "/publish", b'{"channels":["w"],"data":%d}' % i)[0] == 201

    def scrape() -> dict:
        return figures(get(f"http://127.0.0.1:{admin}/metrics")[1])

    # siblings write their slot every 0.5 s
    wait_until(lambda: scrape()[("pushup_publish_latency_seconds_count", ())] == publishes,
               DEADLINE, 0.1, msg=f"{publishes} publishes in one scrape")
    seen = scrape()
    per_worker = [seen[("pushup_worker_published_total", (("worker", str(w)),))]
                  for w in (0, 1)]
    assert all(n > 0 for n in per_worker) and sum(per_worker) == publishes, per_worker
    assert seen[("pushup_responses_total", (("endpoint", "publish"), ("status", "201")))] \
        == publishes
    assert seen[("pushup_request_duration_seconds_count", (("endpoint", "publish"),))] \
        == publishes
    assert get(url + "/metrics")[0] == 404
