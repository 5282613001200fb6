"""A Flask app that publishes to PushUp with pushup.client.

Its pages post chat lines to ``POST /rooms/<room>/messages``; the app
publishes them on ``chat:<room>`` (the publish token stays on the server)
and tells the page whether the message is acknowledged. ``GET
/rooms/<room>/token`` hands a page a subscriber token for that room.

    pip install ./clients/python flask    # pushup-client, from the checkout
    PUSHUP_URLS=http://127.0.0.1:8000 PUSHUP_PUBLISH_TOKEN=... flask --app examples/flask_app run

(``PUSHUP_*`` names here are the app's own settings: a node on the same host
only warns about ``PUSHUP_URLS``.) tests/cluster/test_client.py runs this app
against a real node.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from flask import Flask, Response, jsonify, request

from pushup.client import APIError, Client, Unavailable, mint_token


def create_app(pushup_urls: Sequence[str], publish_token: str | None = None,
               subscribe_secret: str | None = None) -> Flask:
    app = Flask(__name__)
    pushup = Client(pushup_urls, publish_token=publish_token, timeout=5.0, retries=3)

    @app.post("/rooms/<room>/messages")
    def post_message(room: str) -> tuple[Response, int]:
        text = (request.get_json(silent=True) or {}).get("text")
        if not isinstance(text, str) or not text:
            return jsonify(error="bad_text"), 400
        try:
            sent = pushup.publish([f"chat:{room}"], {"text": text})
        except APIError as e:  # a 4xx: the request is wrong, retrying will not help
            return jsonify(error=e.code, message=e.message), 400
        except Unavailable as e:  # retries ran out: say whether it may be stored
            return jsonify(error="unavailable", maybe_stored=e.outcome_unknown,
                           idempotency_key=e.idempotency_key), 503
        return jsonify(id=sent.id, timestamp=sent.timestamp,
                       acknowledged=sent.acknowledged), 201

    @app.get("/rooms/<room>/token")
    def room_token(room: str) -> tuple[Response, int]:
        if subscribe_secret is None:
            return jsonify(token=None), 200
        return jsonify(token=mint_token(subscribe_secret, [f"chat:{room}"], ttl=3600)), 200

    return app


def _from_environment() -> Flask:
    urls = os.environ.get("PUSHUP_URLS", "http://127.0.0.1:8000").split(",")
    return create_app(urls, os.environ.get("PUSHUP_PUBLISH_TOKEN"),
                      os.environ.get("PUSHUP_SUBSCRIBE_SECRET"))


app = _from_environment()  # what `flask --app examples/flask_app run` serves

if __name__ == "__main__":
    app.run()
