"""The public keys of subscriber tokens, from ``--subscribe-jwks FILE_OR_URL``.

A file is read once, at start. A URL is fetched by PyJWT's ``PyJWKClient``,
whose fetch blocks: it runs in a thread (``fetch`` is injected; the node's is
:func:`fetch_in_thread`), so the reactor never waits on it.
The keys are cached; they are fetched again when older than ``interval``
(while the old ones keep serving), and for a token of an unknown ``kid``, at
most once per ``interval``. A fetch that fails keeps the last keys (a JWKS
endpoint down refuses only the kids it never served, 401) and is logged once
per change of state; each fetch gives up after ``FETCH_TIMEOUT`` seconds.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jwt
from twisted.internet import defer
from twisted.logger import Logger
from twisted.python.failure import Failure

from pushup.config import Config
from pushup.http.tokens import KeySource, StaticKeys, Verifier, signing_keys

log = Logger(namespace="pushup")
FETCH_TIMEOUT = 5.0  # seconds a fetch of the JWKS URL may take (a subscribe may wait on it)


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def read_keys(path: str) -> dict[str, jwt.PyJWK]:
    """The signing keys of the JWKS file ``path``; ValueError with one line
    naming the problem (unreadable, not JSON, no usable key)."""
    try:
        data = json.loads(Path(path).read_bytes())
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError:
        raise ValueError(f"{path} is not JSON") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JWKS (an object with keys)")
    try:
        return signing_keys(data)
    except jwt.PyJWTError as e:
        raise ValueError(f"{path}: {e}") from None


def jwks_problem(config: Config) -> str | None:
    """What keeps ``--subscribe-jwks`` from being used, for the CLI to refuse
    the start with (exit 2), or None: a file must hold a usable key set."""
    source = config.subscribe_jwks
    if not source or is_url(source):
        return None
    try:
        read_keys(source)
    except ValueError as e:
        return f"--subscribe-jwks: {e}"
    return None


class RemoteKeys:
    """The keys of a JWKS URL, fetched through ``fetch`` (a blocking function
    run in a thread: ``fetch(url)`` returns a Deferred of the JWKS dict),
    cached and refreshed as the module says. Time is the caller's ``now``."""

    def __init__(self, url: str, interval: float,
                 fetch: Callable[[str], defer.Deferred[Mapping[str, Any]]]) -> None:
        self.url = url
        self.interval = interval
        self.version = 0
        self.fetches = 0  # started, for /stats and the tests
        self._fetch = fetch
        self._keys: dict[str, jwt.PyJWK] = {}
        self._served = ""  # the keys as the URL last gave them (JSON), to see a change
        self._started: float | None = None  # when the last fetch began
        self._waiting: list[defer.Deferred[None]] | None = None  # None: no fetch under way
        self._failing: str | None = None  # the last failure said, once

    def key(self, kid: str, now: float) -> jwt.PyJWK | None:
        if self._waiting is None and (self._started is None
                                      or now - self._started >= self.interval):
            self._begin(now)  # stale: fetched again; meanwhile the old keys serve
        return self._keys.get(kid)

    def refresh(self, now: float) -> defer.Deferred[None] | None:
        if self._waiting is None:
            if self._started is not None and now - self._started < self.interval:
                return None  # an unknown kid fetches at most once per interval
            self._begin(now)
        assert self._waiting is not None
        done: defer.Deferred[None] = defer.Deferred()
        self._waiting.append(done)
        return done

    def start(self, now: float) -> None:
        """Fetch now, so the first token need not wait (and a bad URL is said)."""
        if self._waiting is None:
            self._begin(now)

    def _begin(self, now: float) -> None:
        self._started = now
        self._waiting = []
        self.fetches += 1
        self._fetch(self.url).addCallbacks(self._arrived, self._failed).addBoth(self._wake)

    def _arrived(self, jwks: Mapping[str, Any]) -> None:
        try:
            keys = signing_keys(jwks)
        except jwt.PyJWTError as e:
            self._cannot(str(e))
            return
        if self._failing is not None:
            self._failing = None
            log.info("JWKS {url}: reachable again", url=self.url)
        served = json.dumps(jwks.get("keys"), sort_keys=True)
        if served != self._served:
            log.info("JWKS {url}: keys {kids}", url=self.url, kids=", ".join(sorted(keys)))
            self.version += 1
        self._keys, self._served = keys, served

    def _failed(self, failure: Failure) -> None:
        self._cannot(str(failure.value))

    def _cannot(self, error: str) -> None:
        said = error[:300]
        if said != self._failing:
            self._failing = said
            log.warn("JWKS {url}: cannot fetch the keys ({error}); the last ones serve "
                     "({n} keys)", url=self.url, error=said, n=len(self._keys))

    def _wake(self, outcome: object) -> None:
        if isinstance(outcome, Failure):  # a bug of ours, not the URL's: said, never raised
            log.failure("JWKS {url}: keys not taken", outcome, url=self.url)
        waiting, self._waiting = self._waiting or [], None
        for done in waiting:
            done.callback(None)


def fetch_in_thread(reactor: Any) -> Callable[[str], defer.Deferred[Mapping[str, Any]]]:
    """``fetch`` for :class:`RemoteKeys`: PyJWKClient's blocking GET in a
    thread of its own, its outcome handed to the reactor. A daemon thread, not
    the reactor's pool (``deferToThread``): the pool is joined at shutdown, so a
    fetch hung on a dead endpoint would hold a drain for its whole timeout."""

    def get(url: str) -> Mapping[str, Any]:
        client = jwt.PyJWKClient(url, cache_jwk_set=False, timeout=FETCH_TIMEOUT,
                                 headers={"User-Agent": "pushup"})
        data: Mapping[str, Any] = client.fetch_data()
        return data

    def fetch(url: str) -> defer.Deferred[Mapping[str, Any]]:
        done: defer.Deferred[Mapping[str, Any]] = defer.Deferred()

        def run() -> None:
            try:
                data = get(url)
            except Exception as e:  # every failure is the URL's: said once, last keys kept
                reactor.callFromThread(done.errback, e)
            else:
                reactor.callFromThread(done.callback, data)

        threading.Thread(target=run, name="pushup-jwks", daemon=True).start()
        return done

    return fetch


def private_key(path: str) -> tuple[Any, str]:
    """The private key of the PEM file ``path`` and the algorithm its tokens
    are signed with: RS256 (RSA), ES256 (EC P-256) or EdDSA (Ed25519);
    ValueError with one line otherwise. ``cryptography`` reads the PEM."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path} is not an unencrypted PEM private key: {e}") from None
    if isinstance(key, rsa.RSAPrivateKey):
        return key, "RS256"
    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        return key, "ES256"
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return key, "EdDSA"
    kind = (f"an EC key on {key.curve.name}" if isinstance(key, ec.EllipticCurvePrivateKey)
            else type(key).__name__)
    raise ValueError(f"{path}: an RSA, EC P-256 or Ed25519 key is needed, not {kind}")


def public_jwks(key: Any, algorithm: str, kid: str) -> dict[str, Any]:
    """The JWKS that verifies the tokens of private ``key`` under ``kid``
    (PyJWT writes the JWK)."""
    from jwt.algorithms import get_default_algorithms

    jwk: dict[str, Any] = get_default_algorithms()[algorithm].to_jwk(
        key.public_key(), as_dict=True)
    return {"keys": [jwk | {"kid": kid, "alg": algorithm, "use": "sig"}]}


def subscribe_verifier(config: Config, reactor: Any) -> Verifier | None:
    """The node's subscriber-token verifier, or None when subscribing is open."""
    keys: KeySource | None = None
    if config.subscribe_jwks and is_url(config.subscribe_jwks):
        remote = RemoteKeys(config.subscribe_jwks, config.subscribe_jwks_refresh,
                            fetch_in_thread(reactor))
        remote.start(reactor.seconds())
        keys = remote
    elif config.subscribe_jwks:
        keys = StaticKeys(read_keys(config.subscribe_jwks))
    if keys is None and not config.subscribe_secret:
        return None
    return Verifier(config.subscribe_secret, config.subscribe_secret_previous, keys,
                    issuer=config.subscribe_issuer, audience=config.subscribe_audience)
