"""pushup/ops/jwks.py's RemoteKeys: a JWKS URL's keys are cached and fetched
again once older than the interval; a token of an unknown kid fetches at most
once per interval, and the requests waiting meanwhile share one fetch; a fetch
that fails keeps the last keys, and an unknown kid is then 401, never a hang.
The fetch is a stand-in that the test answers (the real one, PyJWKClient in a
thread, runs against a real HTTP server in tests/e2e/test_jwks.py)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from jwt.algorithms import get_default_algorithms
from twisted.internet import defer

from pushup.core.errors import Unauthorized
from pushup.http.tokens import Verifier, issue
from pushup.ops.jwks import RemoteKeys, jwks_problem, read_keys
from tests.http.test_tokens_keys import failed

URL = "http://127.0.0.1:9/jwks.json"
INTERVAL = 60.0
NOW = 1_800_000_000.0


class Fetches:
    """Each fetch asked for, to be answered by the test."""

    def __init__(self) -> None:
        self.asked: list[defer.Deferred[dict]] = []

    def __call__(self, url: str) -> defer.Deferred[dict]:
        assert url == URL
        self.asked.append(defer.Deferred())
        return self.asked[-1]

    def answer(self, *entries: dict) -> None:
        self.asked[-1].callback({"keys": list(entries)})

    def fail(self, why: str) -> None:
        self.asked[-1].errback(ConnectionRefusedError(why))


def jwk(key, algorithm: str, kid: str) -> dict:
    public = get_default_algorithms()[algorithm].to_jwk(key.public_key(), as_dict=True)
    return public | {"kid": kid, "alg": algorithm}


@pytest.fixture(scope="module")
def pair():
    return ec.generate_private_key(ec.SECP256R1()), ed25519.Ed25519PrivateKey.generate()


def started(fetches: Fetches) -> RemoteKeys:
    keys = RemoteKeys(URL, INTERVAL, fetches)
    keys.start(NOW)
    return keys


def test_the_keys_are_fetched_at_start_and_again_only_once_stale(pair):
    first, _ = pair
    fetches = Fetches()
    keys = started(fetches)
    fetches.answer(jwk(first, "ES256", "k1"))
    assert keys.key("k1", NOW + INTERVAL - 1) is not None
    assert len(fetches.asked) == 1  # cached
    assert keys.key("k1", NOW + INTERVAL) is not None  # the old key serves meanwhile
    assert len(fetches.asked) == 2
    assert keys.key("k1", NOW + INTERVAL + 1) is not None
    assert len(fetches.asked) == 2  # one fetch under way is enough


def test_an_unknown_kid_fetches_at_most_once_per_interval(pair):
    first, second = pair
    fetches = Fetches()
    keys = started(fetches)
    fetches.answer(jwk(first, "ES256", "k1"))
    verifier = Verifier(keys=keys)
    token = issue(second, ["a"], NOW + 600, algorithm="EdDSA", kid="k2")
    # fetched just now: the unknown kid is refused at once, nothing fetched
    with pytest.raises(Unauthorized, match="'k2' is unknown"):
        verifier.check(token, ["a"], NOW + 1)
    assert len(fetches.asked) == 1
    # an interval later: one fetch, shared by every request waiting on it
    waiting = [verifier.check(token, ["a"], NOW + INTERVAL + 1) for _ in range(3)]
    assert len(fetches.asked) == 2 and not any(w.called for w in waiting)
    fetches.answer(jwk(first, "ES256", "k1"), jwk(second, "EdDSA", "k2"))
    assert [w.result for w in waiting] == [NOW + 600] * 3
    assert keys.version == 2


def test_a_jwks_endpoint_down_keeps_the_last_keys_and_refuses_unknown_kids(pair):
    first, second = pair
    fetches = Fetches()
    keys = started(fetches)
    fetches.answer(jwk(first, "ES256", "k1"))
    verifier = Verifier(keys=keys)
    known = issue(first, ["a"], NOW + 600, algorithm="ES256", kid="k1")
    unknown = issue(second, ["a"], NOW + 600, algorithm="EdDSA", kid="k2")
    later = verifier.check(unknown, ["a"], NOW + INTERVAL)
    fetches.fail("connection refused")
    assert "'k2' is unknown" in failed(later).message
    assert verifier.check(known, ["a"], NOW + INTERVAL + 1) == NOW + 600
    assert keys.version == 1  # a failure changes no key


def test_keys_that_are_not_a_key_set_are_a_failure_too(pair):
    first, _ = pair
    fetches = Fetches()
    keys = started(fetches)
    fetches.answer(jwk(first, "ES256", "k1"))
    keys.key("k1", NOW + INTERVAL)
    fetches.asked[-1].callback({"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "s"}]})
    assert keys.key("k1", NOW + INTERVAL + 1) is not None


def test_a_jwks_file_must_hold_a_usable_key(tmp_path, pair):
    from pushup.config import Config

    path = tmp_path / "keys.json"
    path.write_text('{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "s"}]}')
    assert "no key with a kid" in jwks_problem(Config(subscribe_jwks=str(path)))
    path.write_text("not json")
    assert "is not JSON" in jwks_problem(Config(subscribe_jwks=str(path)))
    assert "cannot read" in jwks_problem(Config(subscribe_jwks=str(tmp_path / "none.json")))
    assert jwks_problem(Config(subscribe_jwks=URL)) is None  # fetched once running
    import json

    path.write_text(json.dumps({"keys": [jwk(pair[0], "ES256", "k1")]}))
    assert list(read_keys(str(path))) == ["k1"]


def test_the_nodes_verifier_takes_every_setting(tmp_path, pair):
    import json

    from pushup.config import Config
    from pushup.ops.jwks import subscribe_verifier

    current, previous = "current-secret-" + "c" * 32, "previous-secret-" + "p" * 32
    assert subscribe_verifier(Config(), reactor=None) is None  # subscribing open
    rotating = subscribe_verifier(Config(subscribe_secret=current,
                                         subscribe_secret_previous=previous), reactor=None)
    assert rotating.check(issue(previous, ["a"], NOW + 60), ["a"], NOW) == NOW + 60
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"keys": [jwk(pair[1], "EdDSA", "k1")]}))
    from_file = subscribe_verifier(Config(subscribe_jwks=str(path), subscribe_audience="me"),
                                   reactor=None)
    good = issue(pair[1], ["a"], NOW + 60, algorithm="EdDSA", kid="k1", audience="me")
    assert from_file.check(good, ["a"], NOW) == NOW + 60
    with pytest.raises(Unauthorized, match="aud"):
        from_file.check(issue(pair[1], ["a"], NOW + 60, algorithm="EdDSA", kid="k1"), ["a"], NOW)
    # HS256 is not accepted on a node given only keys
    with pytest.raises(Unauthorized, match="not accepted"):
        from_file.check(issue(current, ["a"], NOW + 60), ["a"], NOW)


@pytest.mark.parametrize("settings, said", [
    ({"subscribe_secret_previous": "p" * 32}, "needs subscribe_secret"),
    ({"subscribe_issuer": "https://idp.test"}, "needs subscribe_secret"),
    ({"subscribe_audience": "pushup"}, "needs subscribe_secret"),
    ({"subscribe_jwks": URL, "subscribe_jwks_refresh": 0.0}, "--subscribe-jwks-refresh"),
])
def test_token_settings_that_cannot_work_are_refused(settings, said):
    from pushup.config import Config, ConfigError, validate

    with pytest.raises(ConfigError, match=said):
        validate(Config(**settings))


def test_a_previous_secret_reaches_workers_in_their_environment_only():
    from pushup.config import Config
    from pushup.ops.workers import worker_argv, worker_env

    config = Config(subscribe_secret="c" * 32, subscribe_secret_previous="p" * 32,
                    subscribe_jwks=URL, workers=2)
    assert not any("p" * 32 in arg for arg in worker_argv(config, 0, 8080))
    assert f"--subscribe-jwks={URL}" in worker_argv(config, 0, 8080)
    assert worker_env(config, {})["PUSHUP_SUBSCRIBE_SECRET_PREVIOUS"] == "p" * 32
