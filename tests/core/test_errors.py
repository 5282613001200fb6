"""pushup/core/errors.py: every error class answers with a status and code that
docs/api.md's table of errors lists together, each code has one status, and a raise
site may name another code only within its class's status."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pushup.core import errors
from pushup.core.errors import BadRequest, MethodNotAllowed, PushUpError

API = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def documented() -> dict[int, set[str]]:
    """docs/api.md's error table: status -> the codes it lists."""
    table = API.read_text().split("## Errors", 1)[1].split("\n## ", 1)[0]
    out: dict[int, set[str]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"\d{3}(, \d{3})*", cells[0]):
            for status in cells[0].split(", "):
                out.setdefault(int(status), set()).update(re.findall(r"`([A-Za-z_]+)`", cells[1]))
    return out


def error_classes() -> list[type[PushUpError]]:
    return [c for c in vars(errors).values()
            if isinstance(c, type) and issubclass(c, PushUpError) and c is not PushUpError]


@pytest.mark.parametrize("cls", error_classes(), ids=lambda c: c.__name__)
def test_each_error_answers_a_documented_status_and_code(cls):
    assert cls.code in documented().get(cls.status, set()), (cls.status, cls.code)


def test_a_code_means_one_status_except_too_large():
    statuses: dict[str, set[int]] = {}
    for cls in error_classes():
        statuses.setdefault(cls.code, set()).add(cls.status)
    assert {code: s for code, s in statuses.items() if len(s) > 1} == {
        "too_large": {413, 414, 431}}


def test_the_sentence_is_the_message_and_a_code_may_be_named_at_the_raise():
    error = BadRequest("limit must be a positive integer")
    assert (error.status, error.code, error.message) == (400, "bad_parameter",
                                                          "limit must be a positive integer")
    assert str(error) == error.message
    assert BadRequest("two Host lines", code="bad_request").code == "bad_request"
    assert BadRequest("x").code == "bad_parameter"  # the class's code is left as it was
    assert MethodNotAllowed("use POST", ("POST",)).allowed == ("POST",)


def test_only_the_engine_says_when_to_retry():
    assert errors.EngineUnavailable("down").retry_after == 1
    assert errors.Unavailable("full").retry_after is None
