"""Locust users for the paper's evaluation (locustfile; run by loadtest.paper.run).

    locust -f loadtest/paper/users.py --headless --host http://127.0.0.1:8080 \
           LongPollUser PublisherUser -u 101 -r 100 -t 60s

- ``LongPollUser`` (ELP and MLP): re-polls at once with its cursor after every
  response, ``timeout`` = PUSHUP_LT_TIMEOUT (50 s, as in the paper).
- ``PullUser`` (CP): polls every second with ``timeout=0``, carrying the cursor.
- ``PublisherUser`` (exactly one): publishes one message at each time of the
  schedule PUSHUP_LT_SCHEDULE (a JSON list of ``[unix_time, tag]``), each
  message carrying ``{"seq", "sent", "tag"}``. The runner picks the times, so
  it knows when to read its counters.

Every message a subscriber receives fires a Locust request event
``request_type="DELIVER", name="mpt <tag>"`` whose response time is the
publish trip time (receive time − ``sent``, ms), so the stats CSV carries MPT
mean and percentiles and the number received. A message seen twice fires
``DUPLICATE`` (there must be none); a response with ``"gap": true`` fires
``GAP``. Each subscriber first makes one ``connect`` request (``timeout=0``);
successful connects are the subscribers RMP divides by.

Settings (environment, so ``--processes`` workers see them too):
PUSHUP_LT_CHANNEL, PUSHUP_LT_TIMEOUT, PUSHUP_LT_NETWORK_TIMEOUT (default
timeout + 20 s), PUSHUP_LT_SCHEDULE, PUSHUP_LT_PAYLOAD (padding bytes per
message, default 0), PUSHUP_LT_PULL_EVERY (CP period, default 1 s).
"""

from __future__ import annotations

import json
import os
import random
import time
from urllib.parse import quote

import gevent
from locust import constant, task
from locust.contrib.fasthttp import FastHttpUser

CHANNEL = os.environ.get("PUSHUP_LT_CHANNEL", "loadtest")
TIMEOUT = float(os.environ.get("PUSHUP_LT_TIMEOUT", "50"))
NETWORK_TIMEOUT = float(os.environ.get("PUSHUP_LT_NETWORK_TIMEOUT", str(TIMEOUT + 20)))
PAYLOAD = int(os.environ.get("PUSHUP_LT_PAYLOAD", "0"))
PULL_EVERY = float(os.environ.get("PUSHUP_LT_PULL_EVERY", "1"))


def _schedule() -> list[tuple[float, str]]:
    raw = os.environ.get("PUSHUP_LT_SCHEDULE", "")
    if not raw:  # standalone use: one message every 10 s from 5 s on, for 10 minutes
        t0 = time.time() + 5
        return [(t0 + 10 * k, "10") for k in range(60)]
    return [(float(t), str(tag)) for t, tag in json.loads(raw)]


class _Subscriber(FastHttpUser):
    abstract = True
    network_timeout = NETWORK_TIMEOUT
    connection_timeout = 60.0
    poll_timeout = TIMEOUT
    poll_name = "subscribe (held)"

    def on_start(self) -> None:
        self.cursor = "0"
        self.seen: set[int] = set()
        self.channel_q = quote(CHANNEL, safe="")
        while not self._poll(0, "connect"):
            gevent.sleep(1.0)

    def _poll(self, timeout: float, name: str) -> bool:
        url = (f"/subscribe?channels={self.channel_q}&since={quote(self.cursor, safe='')}"
               f"&timeout={timeout:g}")
        with self.client.get(url, name=name, catch_response=True) as r:
            if r.status_code != 200:
                r.failure(f"status {r.status_code}")
                return False
            try:
                raw = r.content or b""
                body = json.loads(raw)
            except (ValueError, TypeError) as e:
                r.failure(f"bad body: {e}")
                return False
            r.success()
        now = time.time()
        fire = self.environment.events.request.fire
        messages = body.get("messages", [])
        each = len(raw) // max(1, len(messages))
        for m in messages:
            data = m.get("data")
            if not isinstance(data, dict) or "seq" not in data:
                continue
            tag = str(data.get("tag", ""))
            if data["seq"] in self.seen:
                fire(request_type="DUPLICATE", name=f"dup {tag}", response_time=0,
                     response_length=each, exception=None, context={})
                continue
            self.seen.add(data["seq"])
            fire(request_type="DELIVER", name=f"mpt {tag}",
                 response_time=max(0.0, (now - float(data["sent"])) * 1000.0),
                 response_length=each, exception=None, context={})
        if body.get("gap"):
            fire(request_type="GAP", name="gap", response_time=0, response_length=0,
                 exception=None, context={})
        self.cursor = body.get("cursor", self.cursor)
        return True


class LongPollUser(_Subscriber):
    """ELP/MLP subscriber: a held poll, re-issued at once after every answer."""

    wait_time = constant(0)

    @task
    def poll(self) -> None:
        if not self._poll(self.poll_timeout, self.poll_name):
            gevent.sleep(1.0)  # back off after an error, then resume from the cursor


class PullUser(_Subscriber):
    """CP subscriber: one ``timeout=0`` poll every PULL_EVERY seconds.

    Paced by hand from a random phase: Locust starts users in bursts and its
    ``constant_pacing`` anchors to the user's start, so every client would
    pull in lockstep (and every trip time would be the same).
    """

    wait_time = constant(0)
    poll_name = "subscribe (pull)"

    def on_start(self) -> None:
        super().on_start()
        self.next_at = time.time() + random.uniform(0, PULL_EVERY)

    @task
    def poll(self) -> None:
        delay = self.next_at - time.time()
        if delay > 0:
            gevent.sleep(delay)
        self.next_at = max(self.next_at + PULL_EVERY, time.time())
        self._poll(0, self.poll_name)


class PublisherUser(FastHttpUser):
    """Publishes one message at each scheduled time, then idles."""

    fixed_count = 1
    weight = 0
    wait_time = constant(0)
    network_timeout = 60.0

    def on_start(self) -> None:
        self.schedule = _schedule()
        self.seq = 0

    @task
    def publish(self) -> None:
        for at, tag in self.schedule:
            delay = at - time.time()
            if delay > 0:
                gevent.sleep(delay)
            elif delay < -5:
                continue  # the run started late: never burst old messages
            self.seq += 1
            data = {"seq": self.seq, "sent": time.time(), "tag": tag}
            if PAYLOAD:
                data["pad"] = "x" * PAYLOAD
            body = json.dumps({"channels": [CHANNEL], "data": data})
            with self.client.post("/publish", data=body, name=f"publish {tag}",
                                  headers={"Content-Type": "application/json"},
                                  catch_response=True) as r:
                if r.status_code != 201:
                    r.failure(f"status {r.status_code}")
        while True:
            gevent.sleep(3600)
