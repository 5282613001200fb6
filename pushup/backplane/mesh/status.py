"""How a peer link looks from outside: its state, its /stats entry, its log lines.

``PeerStatus`` holds the state ``/stats`` shows (connecting, up, down,
refused) and tells the log of each change once, never per retry. It decides
nothing about the link (:mod:`pushup.backplane.mesh.peers` does) and reads
time only from the clock it is given.
"""

from __future__ import annotations

from typing import Any, Literal

from twisted.logger import Logger

from pushup.backplane import trouble
from pushup.core.clock import Clock

# The namespace log filters and JSON log lines name (``ops.logs.quiet_siblings``):
# the link's lines keep it, wherever the code that writes them lives.
log = Logger(namespace="pushup.backplane.mesh.peers")
# A peer that is gone is retried every 4-5 s (less ``peers.JITTER``), for as
# long as it is configured: a dead peer costs a connection attempt per 5 s,
# and one that returns is up within 5 s.
BACKOFF_MAX = 5.0
DOWN_LOG_AFTER = 10.0  # seconds unreachable before the log calls a peer down (docs/operations.md)

# connecting: not confirmed yet (starting, or failed fewer than DOWN_AFTER times);
# up: the last exchange succeeded; down: DOWN_AFTER failures in a row, or a
# batch unanswered for ``timeout``; refused: the peer does not take our
# handshake (another cluster secret, or not a PushUp node).
LinkState = Literal["connecting", "up", "down", "refused"]


class PeerStatus:
    """One peer's state as shown, and the log lines that follow it."""

    def __init__(self, url: str, clock: Clock) -> None:
        self.url = url
        self.clock = clock
        self.state: LinkState = "connecting"
        self._reported: str = "connecting"  # the state the log last told
        self._outage_since = clock.seconds()  # unreachable since (starting counts)
        self.dials = 0  # connections attempted since the node started (``dials`` in /stats)

    def show(self, state: LinkState) -> bool:
        """Show the peer as ``state``; True when that is a change."""
        if state == self.state:
            return False
        self.state = state
        return True

    def stats(self, queued: int, sent: int) -> dict[str, Any]:
        """The peer's entry in ``/stats`` ``peers``."""
        return {"url": self.url, "state": self.state, "queued": queued, "sent": sent,
                "dials": self.dials}

    def report(self, why: object) -> None:
        """The log follows the state, once per change and never per retry: a
        peer that was up and is lost is "lost; reconnecting" (info), and
        "down" (a warning) only once it has been unreachable for
        ``DOWN_LOG_AFTER`` seconds, so a peer that is starting, or restarting,
        logs nothing alarming; "up" once it answers; "refused" once."""
        state, reported = self.state, self._reported
        if state == reported:
            return
        now = self.clock.seconds()
        if state == "up":
            self._reported = "up"
            if reported == "down":
                log.info("peer {peer} is up again after {seconds:.0f} s", peer=self.url,
                         state="up", seconds=now - self._outage_since)
            else:
                log.info("peer {peer} is up", peer=self.url, state="up")
        elif state == "refused":
            self._reported = "refused"
            log.warn("peer {peer} refused: {why} (another cluster secret, or not a PushUp "
                     "node?); not waiting for it, retrying quietly", peer=self.url,
                     state="refused", why=trouble(why))
        elif reported in ("up", "refused"):
            self._reported, self._outage_since = "connecting", now
            if reported == "up":
                log.info("peer {peer} lost ({why}); reconnecting", peer=self.url,
                         state="connecting", why=trouble(why))
        elif reported == "connecting" and now - self._outage_since >= DOWN_LOG_AFTER:
            self._reported = "down"
            log.warn("peer {peer} is down: unreachable for {seconds:.0f} s ({why}); "
                     "retrying every {retry:g} s, quietly", peer=self.url, state="down",
                     seconds=now - self._outage_since, why=trouble(why), retry=BACKOFF_MAX)

    def op_dropped(self) -> None:
        log.warn("peer {url}: channel-op queue full, oldest dropped", url=self.url)
