"""`--workers 2`: /stats and /metrics on the shared port show the whole node.

Whichever worker the kernel hands a scrape to, counters are the sum over the
workers and never go back (also when a worker is killed and restarted), and
each worker's own figures are listed, labelled by worker.
"""
from __future__ import annotations

import os
import re
import signal

from tests.cluster.clients import jrequest, request, stats, uniq, wait_until


class Scrapes:
    """Every /stats answer seen, checked for consistency and growth."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.last = -1
        self.answered_by: set[int] = set()

    def __call__(self) -> dict:
        s = stats(self.base)
        assert [w["worker"] for w in s["workers"]] == [0, 1], s
        assert s["published"] == sum(w["published"] for w in s["workers"]), s
        assert s["published"] >= self.last, (self.last, s)  # counters never go back
        self.last = s["published"]
        self.answered_by.add(s["answered_by"])
        return s


def metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
    assert m, (name, labels, text[:2000])
    return float(m.group(1))


def test_stats_and_metrics_sum_over_workers_and_only_grow(workers):
    base = workers.url
    scrape = Scrapes(base)
    ch = uniq("fleet")
    origins = set()
    for k in range(30):
        status, body = jrequest("POST", base + "/publish", {"channels": [ch], "data": k})
        assert status == 201, body
        origins.add(body["id"].rsplit("-", 1)[0])
        scrape()
    assert len(origins) == 2, origins  # both workers took publishes (1 in 2**29 not)
    wait_until(lambda: scrape()["published"] == 30, 10, 0.02, "published == 30")
    wait_until(lambda: scrape.answered_by == {0, 1}, 10, 0.01, "both workers answered")
    s = scrape()
    assert all(w["up"] and w["restarts"] == 0 for w in s["workers"]), s
    assert all(w["peers"][0]["state"] == "up" for w in s["workers"]), s

    _, _, raw = request("GET", base + "/metrics")
    text = raw.decode()
    assert metric(text, "pushup_published_total") == 30
    per = [metric(text, "pushup_worker_published_total", f'{{worker="{i}"}}') for i in (0, 1)]
    assert sum(per) == 30 and all(per), per

    # A worker killed and restarted: its counts are kept, the total never drops.
    victim = s["workers"][0]["pid"]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: (w := scrape()["workers"][0])["pid"] != victim and w["up"], 20, 0.05,
               "worker 0 restarted")
    s = scrape()
    assert s["workers"][0]["restarts"] == 1, s
    assert s["published"] == 30, s
    status, _ = jrequest("POST", base + "/publish", {"channels": [ch], "data": "after"})
    assert status == 201
    wait_until(lambda: scrape()["published"] == 31, 10, 0.02, "published == 31")
