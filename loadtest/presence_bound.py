"""How long presence takes to agree across nodes: ``python -m loadtest.presence_bound``.

On 3 real nodes (deploy/launch.py's LocalCluster), on the mesh and on one
redis-server, times a join seen on another node (a long poll starts on node1,
until node3's ``GET /presence`` counts it), a leave (the poll's client goes:
the window, then node3 says so) and a SIGKILLed node's users gone on the
others. Prints the median and the worst of a few samples of each; docs/api.md
("Presence") states the bound these are measured against.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import time
import urllib.request

from deploy.launch import LocalCluster

SAMPLES = 5
WINDOW_S = 1.0


def occupancy(base: str, ch: str) -> int:
    with urllib.request.urlopen(f"{base}/presence?channels={ch}", timeout=5) as r:
        return int(json.loads(r.read())["channels"][ch]["occupancy"])


def until(check, guard: float = 30.0) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > guard:
            raise TimeoutError("no agreement within the guard")
        time.sleep(0.01)
    return time.monotonic() - start


def held(base: str, ch: str, user: str) -> http.client.HTTPConnection:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", f"/subscribe?channels={ch}&since=now&timeout=50&user={user}"
                        f"&client={user}")
    return conn


def run(engine: str) -> dict[str, list[float]]:
    cluster = LocalCluster(nodes=3, haproxy=False, engine=engine,
                           node_args=["--presence", "--presence-window", str(WINDOW_S)])
    cluster.start()
    found: dict[str, list[float]] = {"join": [], "leave after the window": [], "killed": []}
    try:
        bases = [cluster.node_url(i) for i in range(3)]
        until(lambda: all(json.loads(urllib.request.urlopen(f"{b}/stats").read())
                          ["presence"]["presence_nodes"] == 3 for b in bases))
        for i in range(SAMPLES):
            ch = f"bound-{engine}-{i}"
            conn = held(bases[0], ch, f"u{i}")
            found["join"].append(until(lambda ch=ch: occupancy(bases[2], ch) == 1))
            conn.close()  # the client goes: counted on for the window, then gone
            found["leave after the window"].append(
                until(lambda ch=ch: occupancy(bases[2], ch) == 0) - WINDOW_S)
        ch = f"bound-{engine}-killed"
        conn = held(bases[0], ch, "k")
        until(lambda: occupancy(bases[2], ch) == 1)
        cluster.kill(0)
        found["killed"].append(until(lambda: occupancy(bases[2], ch) == 0))
        conn.close()
    finally:
        cluster.stop()
    return found


def main() -> int:
    for engine in sys.argv[1:] or ["mesh", "redis"]:
        for what, seconds in run(engine).items():
            print(f"{engine:6} {what:24} median {statistics.median(seconds):5.2f} s, "
                  f"worst {max(seconds):5.2f} s ({len(seconds)} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
