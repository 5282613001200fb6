"""A ``Delivery`` as the body of a long poll's answer.

The service answers subscribers with values (:class:`pushup.core.service.Delivery`);
this is where one becomes the JSON of the contract (docs/api.md, "Subscribe"):
``{"messages": [...], "cursor": "...", "gap": true, "closed": [...]}``, with
``gap`` only when true. Each message's JSON was serialised once when it was
published; a message is listed with only the channels the query names. An
event stream renders its own events (:mod:`pushup.http.sse`). Pure: no I/O.
"""

from __future__ import annotations

from pushup.core.model import dumps
from pushup.core.service import Delivery


def poll_body(delivery: Delivery) -> bytes:
    """The JSON body of the 200 that answers a subscribe with ``delivery``."""
    result = delivery.result
    wanted = frozenset(delivery.query.channels)
    parts = [b'{"messages":[', b",".join(m.json_for(wanted) for m in result.messages),
             b'],"cursor":"', result.cursor.encode().encode(), b'"']
    if result.gap:
        parts.append(b',"gap":true')
    parts += [b',"closed":', dumps(list(delivery.closed)), b"}"]
    return b"".join(parts)
