"""``pushup.client``: publish to and subscribe from a PushUp cluster in Python.

Installed alone as the ``pushup-client`` distribution (``pip install
./clients/python`` from a PushUp checkout: httpx and PyJWT, no Twisted); the
server package holds the same files. It imports nothing of the server: a web
app or worker needs only this package.

    from pushup.client import Client

    with Client(["http://node1:8000", "http://node2:8000"], publish_token=TOKEN) as pushup:
        sent = pushup.publish(["chat:room42"], {"text": "hi"})
        sent.id, sent.acknowledged          # 201 -> True, 202 -> False
        for item in pushup.subscribe(["chat:room42"], since="now"):
            ...                              # Message, Gap or Closed

What is retried (503 with its ``Retry-After``, 504, other 5xx, timeouts,
dropped connections: on the next URL, with jittered backoff) and what is
raised (``APIError`` with ``status`` and ``code`` on a 4xx; ``Unavailable``
when the retries ran out) is decided in one place, ``Client._send``. A publish
keeps one ``Idempotency-Key`` over all its attempts, so it is stored once.
``AsyncClient`` is the same on asyncio (``await``, ``async for``).
``mint_token`` signs subscriber tokens for ``--subscribe-secret``.
"""

from pushup.client.aio import AsyncClient, AsyncSubscription
from pushup.client.retry import Backoff
from pushup.client.sync import Client, Subscription
from pushup.client.tokens import mint_token
from pushup.client.values import (
    APIError,
    ChannelInfo,
    Closed,
    Event,
    Gap,
    Message,
    Published,
    PushUpError,
    Receipt,
    Unavailable,
)

__all__ = ["APIError", "AsyncClient", "AsyncSubscription", "Backoff", "ChannelInfo", "Client",
           "Closed", "Event", "Gap", "Message", "Published", "PushUpError", "Receipt",
           "Subscription", "Unavailable", "mint_token"]
