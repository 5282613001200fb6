"""What a node writes to stderr: its start line, then one line per change of
state (a peer, Redis, a drain), as text or JSON lines.

Never a line per request or per retry: Twisted's own chatter (a factory per
connection attempt, ports opened and closed) is filtered out below
``--log-level debug``; a worker of ``--workers`` leaves its sibling links'
info lines out. In JSON, each event's own fields (``peer``, ``state``, the
start line's ``version``, ``node_id``...) are keys of its object.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import version
from typing import Any

from pushup.backplane.mesh.dial import UNIX_SCHEME
from pushup.config import Config, parse_seeds


def start_logging(level: str, form: str = "text", worker: bool = False) -> None:
    """Log to stderr at ``level`` or above, as text or JSON lines. A worker of
    ``--workers`` leaves out the info lines of its links to its siblings
    (up, lost: N workers would log N × (N - 1) of them; its supervisor says
    when a worker exits); their warnings stay."""
    from twisted.logger import (
        FilteringLogObserver,
        LogLevel,
        LogLevelFilterPredicate,
        globalLogBeginner,
        textFileLogObserver,
    )

    threshold = LogLevel.levelWithName(level)
    predicate = LogLevelFilterPredicate(threshold)
    sink = json_lines_observer(sys.stderr) if form == "json" else textFileLogObserver(sys.stderr)
    predicates: list[Any] = [predicate]
    if threshold > LogLevel.debug:
        predicates.append(quiet_twisted)
        if worker:
            predicates.append(quiet_siblings)
    observer = FilteringLogObserver(sink, predicates)
    globalLogBeginner.beginLoggingTo([observer], redirectStandardIO=False)


# Twisted's own lines that say nothing an operator needs: a factory started or
# stopped (one per outgoing connection: per retry to a peer or Redis that is
# down), a port opened or closed (our start line and drain lines say it).
_CHATTER_FORMATS = frozenset({"Starting factory {factory!r}", "Stopping factory {factory!r}",
                              "Main loop terminated."})
_CHATTER_TEXT = re.compile(r"^(\S+ starting on \S+|\(\S+ Port \S+ Closed\))$")


def quiet_twisted(event: dict[str, Any]) -> Any:
    """A log filter: Twisted's chatter out (kept with ``--log-level debug``)."""
    from twisted.logger import PredicateResult

    if event.get("log_format") in _CHATTER_FORMATS:
        return PredicateResult.no
    message = event.get("message")
    if (isinstance(message, tuple) and len(message) == 1 and isinstance(message[0], str)
            and _CHATTER_TEXT.match(message[0])):
        return PredicateResult.no
    return PredicateResult.maybe


def quiet_siblings(event: dict[str, Any]) -> Any:
    """A log filter for a worker: its sibling links' info lines out (a
    sibling's URL is a Unix socket's; links to other nodes still log)."""
    from twisted.logger import LogLevel, PredicateResult

    if (event.get("log_namespace") == "pushup.backplane.mesh.peers"
            and str(event.get("peer", "")).startswith(UNIX_SCHEME + "://")
            and event.get("log_level", LogLevel.info) < LogLevel.warn):
        return PredicateResult.no
    return PredicateResult.maybe


def json_lines_observer(out: Any) -> Any:
    """One JSON object a line (time, level, namespace, message, then the event's
    own fields, e.g. ``peer`` and ``state``; a failure's traceback as
    ``traceback``): what log shippers read."""
    import json

    from twisted.logger import formatEvent

    def observe(event: dict[str, Any]) -> None:
        record = {"time": round(event.get("log_time", 0.0), 6),
                  "level": getattr(event.get("log_level"), "name", "info"),
                  "namespace": event.get("log_namespace", ""),
                  "message": formatEvent(event)}
        for key, value in event.items():
            if (not key.startswith("log_") and key not in record and key not in _LEGACY
                    and isinstance(value, _PLAIN)):
                record[key] = value if not isinstance(value, tuple) else list(value)
        failure = event.get("log_failure")
        if failure is not None:
            record["traceback"] = failure.getTraceback()
        out.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
        out.flush()

    return observe


_PLAIN = (str, int, float, bool, list, tuple, type(None))
# keys twisted.python.log's legacy events carry besides the message
_LEGACY = frozenset({"message", "system", "format", "isError", "time", "failure"})


def start_line(config: Config, node_id: str, address: str,
               worker: tuple[int, int] | None = None, engine: str = "mesh") -> dict[str, Any]:
    """The fields of the one line a node logs when it starts (``worker``: its
    index and the count, for one of ``--workers``; ``engine``: its backplane's,
    as ``/stats`` names it: ``single`` for a lone node, ``mesh`` or ``redis``)."""
    from pushup import BUILD

    fields: dict[str, Any] = {"version": version("pushup"), "node_id": node_id,
                              "address": address, "workers": config.workers, "core": BUILD,
                              "engine": engine}
    if engine == "mesh":
        fields["peers"] = list(config.peer)
    elif engine == "redis":  # str() of a Redis URL leaves its credentials out
        fields["redis"] = ",".join(str(seed) for seed in parse_seeds(config.engine))
    if config.admin_port:
        host = f"[{config.admin_host}]" if ":" in config.admin_host else config.admin_host
        fields["admin"] = f"http://{host}:{config.admin_port}"
    if worker is not None:
        fields["worker"], fields["workers"] = worker
    return fields


def log_start(fields: dict[str, Any]) -> None:
    from twisted.logger import Logger

    def text(said: str) -> str:  # URLs are words of the line, not fields to fill in
        return said.replace("{", "{{").replace("}", "}}")

    worker = " (worker {worker} of {workers})" if "worker" in fields else ""
    line = "pushup {version} node {node_id}" + worker + " listening on {address}; engine {engine}"
    if fields["engine"] == "mesh":
        line += "; peers " + text(", ".join(fields["peers"]) or "none")
    elif fields["engine"] == "redis":
        line += "; redis " + text(fields["redis"])
    line += "; workers {workers}; core {core}"
    if "admin" in fields:
        line += "; /metrics and /stats on {admin}"
    Logger(namespace="pushup").info(line, **fields)
