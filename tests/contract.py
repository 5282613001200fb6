"""The API's one error shape as every test checks it (docs/api.md, "Errors"):
``{"error": {"code", "message"}}`` as JSON, ``code`` snake_case, ``message``
not empty. For the in-memory harness's responses (tests/conftest.py) and a
real node's (tests/e2e/support.py) alike: each has ``status``, ``header(name)``
and ``json``."""

from __future__ import annotations

import re
from typing import Any, Protocol

JSON_CT = "application/json; charset=utf-8"


class Answered(Protocol):
    """What ``assert_error`` reads of a response."""

    status: int

    def header(self, name: str) -> str | None: ...

    @property
    def json(self) -> Any: ...


def assert_error(response: Answered, status: int, code: str | None = None) -> dict[str, str]:
    """``response`` is the contract's error with ``status`` (and ``code``, unless
    None: then any snake_case code); returns its ``error`` object."""
    assert response.status == status, response
    assert response.header("content-type") == JSON_CT, response
    body = response.json
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"code", "message"}, body
    assert isinstance(error["code"], str) and re.fullmatch(r"[a-z][a-z0-9_]*", error["code"]), body
    if code is not None:
        assert error["code"] == code, (code, body)
    assert isinstance(error["message"], str) and error["message"].strip(), body
    return error
