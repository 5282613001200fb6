"""The private link of experiment 2: one network namespace and one veth pair, all ours.

Everything is named with `PREFIX`, so a run first removes leftovers of an
earlier one (killed -9, say) by those names and nothing else. The server side
of the pair stays in the root namespace with 10.233.0.1/30; the subscriber side
is moved into namespace `PREFIX-sub` with 10.233.0.2/30. The /30 holds only
these two addresses, so traffic goes nowhere else. GSO is limited to one
segment per packet on both ends, so every packet the kernel handles is one
wire-sized packet (a NIC without TSO, as in seed 002); the counters are then
packets, not 64 KB super-packets. `tc netem` is not in this kernel, so delay
and loss are not emulated; `tc tbf` caps the bandwidth.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from .measure import run_logged

PREFIX = "puseed"
NETNS = f"{PREFIX}-sub"
NETNS_PATH = f"/var/run/netns/{NETNS}"
SERVER_IF, CLIENT_IF = f"{PREFIX}-srv", f"{PREFIX}-cli"
SERVER_IP, CLIENT_IP = "10.233.0.1", "10.233.0.2"


def _exists_link(name: str) -> bool:
    return os.path.exists(f"/sys/class/net/{name}")


def teardown() -> None:
    """Remove our veth pair and namespace if present; raises if either survives.

    The link goes first (deleting one end removes both); deleting the namespace
    also destroys the pair, but asynchronously, so a link already gone is fine."""
    if _exists_link(SERVER_IF):
        r = subprocess.run(["ip", "link", "del", SERVER_IF], capture_output=True, text=True,
                           timeout=30)
        if r.returncode and "Cannot find device" not in r.stderr:
            raise RuntimeError(f"ip link del {SERVER_IF}: {r.stderr.strip()}")
    if os.path.exists(NETNS_PATH):
        run_logged(["ip", "netns", "del", NETNS])
    if _exists_link(SERVER_IF) or os.path.exists(NETNS_PATH):
        raise RuntimeError(f"{SERVER_IF} or {NETNS} survived the teardown")


def setup() -> None:
    teardown()
    run_logged(["ip", "netns", "add", NETNS])
    run_logged(["ip", "link", "add", SERVER_IF, "type", "veth", "peer", "name", CLIENT_IF])
    run_logged(["ip", "link", "set", CLIENT_IF, "netns", NETNS])
    run_logged(["ip", "addr", "add", f"{SERVER_IP}/30", "dev", SERVER_IF])
    run_logged(["ip", "-n", NETNS, "addr", "add", f"{CLIENT_IP}/30", "dev", CLIENT_IF])
    for ns in ([], ["-n", NETNS]):
        dev = CLIENT_IF if ns else SERVER_IF
        run_logged(["ip", *ns, "link", "set", dev, "gso_max_segs", "1", "up"])
    run_logged(["ip", "-n", NETNS, "link", "set", "lo", "up"])


@contextmanager
def private_link() -> Iterator[None]:
    setup()
    try:
        yield
    finally:
        teardown()


def set_mtu(mtu: int) -> None:
    run_logged(["ip", "link", "set", SERVER_IF, "mtu", str(mtu)])
    run_logged(["ip", "-n", NETNS, "link", "set", CLIENT_IF, "mtu", str(mtu)])


def set_bandwidth(rate: str | None) -> None:
    """Cap both directions with tbf at `rate` (tc syntax, e.g. "100mbit"); None: no cap."""
    for ns, dev in (([], SERVER_IF), (["-n", NETNS], CLIENT_IF)):
        if rate is None:
            # Back to the veth's default (noqueue); "no such qdisc" when none was set.
            subprocess.run(["tc", *ns, "qdisc", "del", "dev", dev, "root"],
                           capture_output=True, timeout=30)
        else:
            run_logged(["tc", *ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                        "burst", "64kb", "limit", "32mb"])


def link_counters() -> dict[str, int]:
    """Packets and bytes of the server's end of the pair (tx: to subscribers)."""
    out = {}
    for key in ("tx_packets", "rx_packets", "tx_bytes", "rx_bytes", "tx_dropped"):
        with open(f"/sys/class/net/{SERVER_IF}/statistics/{key}") as f:
            out[key] = int(f.read())
    return out


def qdisc_drops() -> int:
    """Packets dropped by the qdiscs on the server's end (tbf's queue overflowing)."""
    r = run_logged(["tc", "-s", "-j", "qdisc", "show", "dev", SERVER_IF])
    return sum(int(q.get("drops", 0)) for q in json.loads(r.stdout or "[]"))


def tcp_segments(pid: int) -> dict[str, int]:
    """The subscriber namespace's TCP InSegs/OutSegs/RetransSegs, read through a process
    that lives in it."""
    with open(f"/proc/{pid}/net/snmp") as f:
        lines = [line.split() for line in f if line.startswith("Tcp:")]
    names, values = lines[0][1:], lines[1][1:]
    tcp = dict(zip(names, (int(v) for v in values), strict=True))
    return {k: tcp[k] for k in ("InSegs", "OutSegs", "RetransSegs")}
