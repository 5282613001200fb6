"""pushup/http/tokens.py: a subscribe token grants exactly its channels and the
prefixes it names with ``*``, until its ``exp`` by the caller's clock; anything
missing, forged, malformed or expired is 401, a channel it does not grant 403."""

from __future__ import annotations

import jwt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pushup.core.errors import Forbidden, Unauthorized
from pushup.http.tokens import ALGORITHM, Verifier, issue

SECRET = "a-subscribe-secret-long-enough-for-hs512-too-" + "x" * 32
NOW = 1_800_000_000.0


def test_a_token_grants_its_names_and_prefixes_until_it_expires():
    token = issue(SECRET, ["news", "chat:room42:*"], NOW + 60)
    verifier = Verifier(SECRET)
    assert verifier.check(token, ["news", "chat:room42:a", "chat:room42:"], NOW) == NOW + 60
    with pytest.raises(Forbidden, match="chat:room43"):
        verifier.check(token, ["news", "chat:room43"], NOW)
    with pytest.raises(Forbidden):
        verifier.check(token, ["newsroom"], NOW)  # a name is exact, not a prefix


def test_expiry_is_judged_by_the_callers_clock_also_once_remembered():
    token = issue(SECRET, ["a"], NOW + 60)
    verifier = Verifier(SECRET)
    assert verifier.check(token, ["a"], NOW + 59) == NOW + 60  # verified and remembered
    with pytest.raises(Unauthorized, match="expired"):
        verifier.check(token, ["a"], NOW + 60)
    # a token long expired by the wall clock is good while the caller's clock says so
    old = issue(SECRET, ["a"], 1000)
    assert Verifier(SECRET).check(old, ["a"], 999) == 1000


@pytest.mark.parametrize("token", [
    None,
    "",
    "not-a-jwt",
    issue("another-secret-" + "y" * 32, ["a"], NOW + 60),  # forged
    jwt.encode({"channels": ["a"]}, SECRET, algorithm=ALGORITHM),  # no exp
    jwt.encode({"exp": int(NOW + 60)}, SECRET, algorithm=ALGORITHM),  # no channels
    jwt.encode({"channels": "a", "exp": int(NOW + 60)}, SECRET, algorithm=ALGORITHM),
    jwt.encode({"channels": ["a", ""], "exp": int(NOW + 60)}, SECRET, algorithm=ALGORITHM),
    jwt.encode({"channels": ["a"], "exp": int(NOW + 60)}, SECRET, algorithm="HS512"),
], ids=["none", "empty", "garbage", "forged", "no-exp", "no-channels", "channels-not-list",
        "empty-name", "other-algorithm"])
def test_a_missing_forged_or_malformed_token_is_401(token):
    with pytest.raises(Unauthorized) as raised:
        Verifier(SECRET).check(token, ["a"], NOW)
    assert (raised.value.status, raised.value.code) == (401, "unauthorized")


@given(st.lists(st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1,
                        max_size=8), min_size=1, max_size=5),
       st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF), min_size=1, max_size=10))
def test_a_channel_is_granted_exactly_when_a_name_or_a_prefix_covers_it(names, channel):
    token = issue(SECRET, names, NOW + 60)
    covered = channel in names or any(n.endswith("*") and channel.startswith(n[:-1])
                                      for n in names)
    verifier = Verifier(SECRET)
    if covered:
        assert verifier.check(token, [channel], NOW) == NOW + 60
    else:
        with pytest.raises(Forbidden):
            verifier.check(token, [channel], NOW)
