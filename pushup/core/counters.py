"""The node's monotonic counts: what the service and the HTTP front add to.

A plain mutable record, owned by the node's ``Service`` and shared with its
front; :mod:`pushup.ops.metrics` reads it to build ``/stats`` and
``/metrics``. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Counters:
    """Monotonic counts the node keeps (mutable, owned by the node)."""

    published: int = 0  # messages accepted from publishers here, once each
    delivered: int = 0  # messages handed to subscribers, per subscriber
    bytes_in: int = 0
    bytes_out: int = 0
    connections: int = 0  # open now
    refused: int = 0  # connections answered 503 overloaded
