"""Bytes on the wire per TCP port, from nftables counters (needs root).

On loopback every packet passes the ``output`` hook once, so one rule per
direction and port counts each byte once, IP and TCP headers, handshakes,
ACKs and FINs included — the paper's "network traffic", which Locust's
body-only ``response_length`` cannot give.

    with PortCounter([8080]) as nc:
        before = nc.read()
        ...
        after = nc.read()

The table is named per process and deleted on exit (also on error, and by
an ``atexit`` hook), so a crashed run leaves no rules behind.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass


class NetCountUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class Traffic:
    """Counters for one port: to it (requests) and from it (responses)."""

    up_bytes: int = 0
    up_packets: int = 0
    down_bytes: int = 0
    down_packets: int = 0

    @property
    def bytes(self) -> int:
        return self.up_bytes + self.down_bytes

    @property
    def packets(self) -> int:
        return self.up_packets + self.down_packets

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(self.up_bytes - other.up_bytes, self.up_packets - other.up_packets,
                       self.down_bytes - other.down_bytes,
                       self.down_packets - other.down_packets)

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.up_bytes + other.up_bytes, self.up_packets + other.up_packets,
                       self.down_bytes + other.down_bytes,
                       self.down_packets + other.down_packets)

    def as_dict(self) -> dict[str, int]:
        return {"bytes": self.bytes, "packets": self.packets, "up_bytes": self.up_bytes,
                "down_bytes": self.down_bytes, "up_packets": self.up_packets,
                "down_packets": self.down_packets}


def available() -> str:
    """'' if counters can be used here, else the reason they cannot."""
    if shutil.which("nft") is None:
        return "nft not installed (apt-get install nftables)"
    if os.geteuid() != 0:
        return "nftables counters need root"
    return ""


def _nft(*args: str, stdin: str | None = None) -> str:
    r = subprocess.run(["nft", *args], input=stdin, capture_output=True, text=True, timeout=10)
    if r.returncode != 0:
        raise NetCountUnavailable(f"nft {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


class PortCounter:
    """Per-port byte/packet counters in a private nftables table."""

    def __init__(self, ports: Iterable[int], name: str | None = None) -> None:
        self.ports = sorted(set(ports))
        self.table = name or f"pushup_lt_{os.getpid()}"
        self.active = False

    def start(self) -> PortCounter:
        reason = available()
        if reason:
            raise NetCountUnavailable(reason)
        self.stop()  # a leftover from a crashed run with the same pid
        rules = [f"add table inet {self.table}",
                 f"add chain inet {self.table} out {{ type filter hook output priority 0; }}"]
        for p in self.ports:
            rules.append(f"add rule inet {self.table} out tcp dport {p} counter comment \"up {p}\"")
            rules.append(
                f"add rule inet {self.table} out tcp sport {p} counter comment \"down {p}\"")
        _nft("-f", "-", stdin="\n".join(rules) + "\n")
        self.active = True
        atexit.register(self.stop)
        return self

    def read(self) -> dict[int, Traffic]:
        """Counters since start, per port."""
        out = json.loads(_nft("-j", "list", "table", "inet", self.table))
        acc: dict[int, dict[str, int]] = {p: {} for p in self.ports}
        for item in out.get("nftables", []):
            rule = item.get("rule")
            if not rule:
                continue
            comment = rule.get("comment", "")
            direction, _, port = comment.partition(" ")
            if not port.isdigit() or int(port) not in acc:
                continue
            for expr in rule.get("expr", []):
                if "counter" in expr:
                    acc[int(port)][direction] = expr["counter"]
        result = {}
        for p, d in acc.items():
            up, down = d.get("up", {}), d.get("down", {})
            result[p] = Traffic(up.get("bytes", 0), up.get("packets", 0),
                                down.get("bytes", 0), down.get("packets", 0))
        return result

    def total(self, ports: Iterable[int] | None = None) -> Traffic:
        counts = self.read()
        t = Traffic()
        for p in (self.ports if ports is None else ports):
            t = t + counts.get(p, Traffic())
        return t

    def stop(self) -> None:
        subprocess.run(["nft", "delete", "table", "inet", self.table],
                       capture_output=True, timeout=10)
        self.active = False

    def __enter__(self) -> PortCounter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
