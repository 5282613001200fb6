"""pushup/http/tokens.py with keys of the ecosystem: a token signed RS256, ES256
or EdDSA verifies against the JWKS key its kid names, and only that key; HS256
verifies with the current secret or the previous one during a rotation; iss and
aud are required when configured; a kid the keys do not hold is 401 (after one
more look-up, when the source can look again). Every key is made here, by
``cryptography``; PyJWT signs and verifies."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import get_default_algorithms
from twisted.internet import defer

from pushup.core.errors import Forbidden, Unauthorized
from pushup.http.tokens import StaticKeys, Verifier, issue, signing_keys

NOW = 1_800_000_000.0
SECRET = "the-current-subscribe-secret-" + "c" * 32
PREVIOUS = "the-previous-subscribe-secret-" + "p" * 32


def new_key(algorithm: str):
    if algorithm == "RS256":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if algorithm == "ES256":
        return ec.generate_private_key(ec.SECP256R1())
    return ed25519.Ed25519PrivateKey.generate()


def jwk(key, algorithm: str, kid: str) -> dict:
    public = get_default_algorithms()[algorithm].to_jwk(key.public_key(), as_dict=True)
    return public | {"kid": kid, "alg": algorithm, "use": "sig"}


def keyring(*entries: dict) -> StaticKeys:
    return StaticKeys(signing_keys({"keys": list(entries)}))


@pytest.fixture(scope="module")
def keys():
    return {alg: new_key(alg) for alg in ("RS256", "ES256", "EdDSA")}


@pytest.mark.parametrize("algorithm", ["RS256", "ES256", "EdDSA"])
def test_a_token_signed_with_a_listed_key_grants_its_channels(keys, algorithm):
    key = keys[algorithm]
    verifier = Verifier(keys=keyring(jwk(key, algorithm, "k1")))
    token = issue(key, ["news", "room:*"], NOW + 60, algorithm=algorithm, kid="k1")
    assert verifier.check(token, ["news", "room:7"], NOW) == NOW + 60
    with pytest.raises(Forbidden):
        verifier.check(token, ["sport"], NOW)


@pytest.mark.parametrize("algorithm", ["RS256", "ES256", "EdDSA"])
def test_a_token_of_another_key_under_a_listed_kid_is_401(keys, algorithm):
    verifier = Verifier(keys=keyring(jwk(keys[algorithm], algorithm, "k1")))
    forged = issue(new_key(algorithm), ["news"], NOW + 60, algorithm=algorithm, kid="k1")
    with pytest.raises(Unauthorized, match="not valid"):
        verifier.check(forged, ["news"], NOW)


def test_the_kid_chooses_the_key_among_several(keys):
    verifier = Verifier(keys=keyring(jwk(keys["RS256"], "RS256", "rsa"),
                                     jwk(keys["EdDSA"], "EdDSA", "ed")))
    good = issue(keys["EdDSA"], ["a"], NOW + 60, algorithm="EdDSA", kid="ed")
    assert verifier.check(good, ["a"], NOW) == NOW + 60
    # the RSA key's token under the Ed25519 key's kid: the key named is not its own
    misnamed = issue(keys["RS256"], ["a"], NOW + 60, algorithm="RS256", kid="ed")
    with pytest.raises(Unauthorized):
        verifier.check(misnamed, ["a"], NOW)


def test_an_unknown_or_missing_kid_is_401(keys):
    verifier = Verifier(keys=keyring(jwk(keys["ES256"], "ES256", "k1")))
    unknown = issue(keys["ES256"], ["a"], NOW + 60, algorithm="ES256", kid="k2")
    with pytest.raises(Unauthorized, match="'k2' is unknown") as raised:
        verifier.check(unknown, ["a"], NOW)
    assert (raised.value.status, raised.value.code) == (401, "unauthorized")
    nameless = issue(keys["ES256"], ["a"], NOW + 60, algorithm="ES256")
    with pytest.raises(Unauthorized, match="no kid"):
        verifier.check(nameless, ["a"], NOW)


def test_an_expired_or_not_yet_valid_token_is_401_by_the_callers_clock(keys):
    key = keys["RS256"]
    verifier = Verifier(keys=keyring(jwk(key, "RS256", "k1")))
    token = issue(key, ["a"], NOW + 60, algorithm="RS256", kid="k1")
    assert verifier.check(token, ["a"], NOW + 59) == NOW + 60
    with pytest.raises(Unauthorized, match="expired"):
        verifier.check(token, ["a"], NOW + 60)
    later = jwt.encode({"channels": ["a"], "exp": int(NOW + 600), "nbf": int(NOW + 300)},
                       key, algorithm="RS256", headers={"kid": "k1"})
    with pytest.raises(Unauthorized, match="not valid yet"):
        verifier.check(later, ["a"], NOW)
    assert verifier.check(later, ["a"], NOW + 300) == NOW + 600


def test_hs256_verifies_with_the_current_or_the_previous_secret_only():
    verifier = Verifier(SECRET, PREVIOUS)
    assert verifier.check(issue(SECRET, ["a"], NOW + 60), ["a"], NOW) == NOW + 60
    assert verifier.check(issue(PREVIOUS, ["a"], NOW + 60), ["a"], NOW) == NOW + 60
    with pytest.raises(Unauthorized, match="not valid"):
        verifier.check(issue("some-third-secret-" + "t" * 32, ["a"], NOW + 60), ["a"], NOW)
    # once the rotation is over, the previous secret's tokens are refused
    with pytest.raises(Unauthorized):
        Verifier(SECRET).check(issue(PREVIOUS, ["a"], NOW + 60), ["a"], NOW)


@pytest.mark.parametrize("claims, said", [
    ({"iss": "https://other.example", "aud": "pushup"}, "(?i)issuer"),
    ({"aud": "pushup"}, "iss"),
    ({"iss": "https://idp.example", "aud": "another-service"}, "(?i)audience"),
    ({"iss": "https://idp.example"}, "aud"),
], ids=["wrong-iss", "no-iss", "wrong-aud", "no-aud"])
@pytest.mark.parametrize("signed", ["HS256", "EdDSA"])
def test_a_wrong_or_missing_issuer_or_audience_is_401(keys, claims, said, signed):
    key, kid = (SECRET, None) if signed == "HS256" else (keys["EdDSA"], "k1")
    verifier = Verifier(SECRET, keys=keyring(jwk(keys["EdDSA"], "EdDSA", "k1")),
                        issuer="https://idp.example", audience="pushup")
    good = jwt.encode({"channels": ["a"], "exp": int(NOW + 60), "iss": "https://idp.example",
                       "aud": ["pushup", "api"]}, key, algorithm=signed,
                      headers={"kid": kid} if kid else None)
    assert verifier.check(good, ["a"], NOW) == NOW + 60
    bad = jwt.encode({"channels": ["a"], "exp": int(NOW + 60)} | claims, key, algorithm=signed,
                     headers={"kid": kid} if kid else None)
    with pytest.raises(Unauthorized, match=said):
        verifier.check(bad, ["a"], NOW)


def test_an_audience_is_ignored_unless_one_is_configured(keys):
    token = jwt.encode({"channels": ["a"], "exp": int(NOW + 60), "aud": "any", "iss": "any"},
                       keys["ES256"], algorithm="ES256", headers={"kid": "k1"})
    verifier = Verifier(keys=keyring(jwk(keys["ES256"], "ES256", "k1")))
    assert verifier.check(token, ["a"], NOW) == NOW + 60


def test_an_algorithm_not_configured_is_401(keys):
    rsa_key = keys["RS256"]
    only_keys = Verifier(keys=keyring(jwk(rsa_key, "RS256", "k1")))
    # HS256 "signed" with the public key, the classic confusion: no secret, refused
    public_pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    confused = hs256_by_hand(public_pem, {"channels": ["a"], "exp": int(NOW + 60)}, "k1")
    with pytest.raises(Unauthorized, match="algorithm 'HS256' is not accepted"):
        only_keys.check(confused, ["a"], NOW)
    unsigned = jwt.encode({"channels": ["a"], "exp": int(NOW + 60)}, None, algorithm="none",
                          headers={"kid": "k1"})
    with pytest.raises(Unauthorized, match="'none'"):
        only_keys.check(unsigned, ["a"], NOW)
    asymmetric = issue(rsa_key, ["a"], NOW + 60, algorithm="RS256", kid="k1")
    with pytest.raises(Unauthorized, match="'RS256' is not accepted here: HS256"):
        Verifier(SECRET).check(asymmetric, ["a"], NOW)


def hs256_by_hand(secret: bytes, claims: dict, kid: str) -> str:
    """An attacker's token, HMAC-signed with ``secret`` (PyJWT refuses a PEM as
    an HMAC secret, so the attacker signs by hand)."""
    def part(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    head = part(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
    body = part(json.dumps(claims).encode())
    signature = part(hmac.new(secret, head + b"." + body, hashlib.sha256).digest())
    return (head + b"." + body + b"." + signature).decode()


def test_a_key_set_keeps_only_signing_keys_with_a_kid(keys):
    encryption = jwk(keys["RS256"], "RS256", "enc") | {"use": "enc"}
    nameless = {k: v for k, v in jwk(keys["ES256"], "ES256", "x").items() if k != "kid"}
    symmetric = {"kty": "oct", "k": "c2VjcmV0", "kid": "oct", "alg": "HS256"}
    signing = jwk(keys["EdDSA"], "EdDSA", "sig")
    assert list(signing_keys({"keys": [encryption, nameless, symmetric, signing]})) == ["sig"]
    with pytest.raises(jwt.PyJWKSetError):
        signing_keys({"keys": [encryption, symmetric]})


class Rotating:
    """A key source that learns a new key when asked to look again (the real,
    fetching one is pushup/ops/jwks.py's, tested in tests/ops/test_jwks.py)."""

    def __init__(self, first: dict) -> None:
        self.version = 0
        self.keys = signing_keys({"keys": [first]})
        self.later: list[defer.Deferred[None]] = []

    def key(self, kid, now):
        return self.keys.get(kid)

    def refresh(self, now):
        self.later.append(defer.Deferred())
        return self.later[-1]

    def learn(self, entry: dict | None) -> None:
        if entry is not None:
            self.keys = signing_keys({"keys": [entry]})
            self.version += 1
        self.later.pop(0).callback(None)


def test_an_unknown_kid_is_answered_once_the_keys_were_looked_up_again(keys):
    old, new = keys["RS256"], keys["ES256"]
    source = Rotating(jwk(old, "RS256", "old"))
    verifier = Verifier(keys=source)
    old_token = issue(old, ["a"], NOW + 60, algorithm="RS256", kid="old")
    assert verifier.check(old_token, ["a"], NOW) == NOW + 60
    new_token = issue(new, ["a"], NOW + 60, algorithm="ES256", kid="new")
    later = verifier.check(new_token, ["a"], NOW)
    assert isinstance(later, defer.Deferred) and not later.called
    source.learn(jwk(new, "ES256", "new"))  # the old key withdrawn
    assert later.result == NOW + 60
    # the old key's token, verified and remembered before, is refused now
    gone = verifier.check(old_token, ["a"], NOW)
    source.learn(None)
    assert "'old' is unknown" in failed(gone).message


def test_a_kid_still_unknown_after_the_look_up_is_401(keys):
    source = Rotating(jwk(keys["RS256"], "RS256", "k1"))
    later = Verifier(keys=source).check(
        issue(keys["EdDSA"], ["a"], NOW + 60, algorithm="EdDSA", kid="k9"), ["a"], NOW)
    source.learn(None)
    error = failed(later)
    assert (error.status, error.code) == (401, "unauthorized") and "'k9'" in error.message


def failed(later) -> Unauthorized:
    """The error a fired Deferred failed with (handled here)."""
    errors: list[Unauthorized] = []
    later.addErrback(lambda f: errors.append(f.value))
    assert len(errors) == 1 and isinstance(errors[0], Unauthorized), later
    return errors[0]
