"""The Ed25519 key that signs Durable Streams webhook deliveries (protocol
§6.5, §7.1), and its public half as a JWK Set.

The private key is ``--stream-webhook-key FILE`` (PKCS#8 or OpenSSL PEM,
unencrypted), the same on every node of a cluster; without it a node makes
one when first asked for one (said once in the log), kept in ``--data-dir``
when it has one (``stream-webhook.pem``, mode 0600), else as long as the
process lives. The
``kid`` is ``ds_`` and the key's RFC 7638 thumbprint, so it is stable for
the key's life and the same on every node holding the key. A signature is
``t=<unix seconds>,kid=<kid>,ed25519=<unpadded base64url>`` over
``<t>.<body>``. The secret that signs the wakes' callback and claim tokens
is derived from the key (HKDF-SHA256), so it is the same wherever the key
is. All the cryptography is the ``cryptography`` package's; the JWK is
PyJWT's export.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from jwt.algorithms import OKPAlgorithm
from twisted.logger import Logger

from pushup.config import Config

log = Logger(namespace="pushup")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class WebhookKey:
    """One Ed25519 signing key: ``kid``, ``jwks`` and ``signature``."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self._private = private
        jwk = OKPAlgorithm.to_jwk(private.public_key(), as_dict=True)
        # RFC 7638: the required members, sorted, no spaces, SHA-256
        members = json.dumps({k: jwk[k] for k in ("crv", "kty", "x")}, sort_keys=True,
                             separators=(",", ":"))
        self.kid = "ds_" + _b64url(hashlib.sha256(members.encode()).digest())
        self.jwk: dict[str, str] = {**jwk, "kid": self.kid, "use": "sig", "alg": "EdDSA"}
        raw = private.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                    serialization.NoEncryption())
        # the HS256 secret of the wakes' tokens, derived from this key
        self.token_secret = HKDF(hashes.SHA256(), 32, salt=None,
                                 info=b"pushup durable streams wake tokens").derive(raw)

    @property
    def jwks(self) -> dict[str, list[dict[str, str]]]:
        return {"keys": [self.jwk]}

    def signature(self, timestamp: int, body: bytes) -> str:
        """The ``Webhook-Signature`` header's value for ``body`` sent at ``timestamp``."""
        signed = self._private.sign(str(timestamp).encode() + b"." + body)
        return f"t={timestamp},kid={self.kid},ed25519={_b64url(signed)}"


def read_key(path: str) -> WebhookKey:
    """The key of the PEM file ``path``; ValueError naming what is wrong."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ValueError(f"--stream-webhook-key: cannot read {path}: "
                         f"{e.strerror or e}") from None
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as e:
        raise ValueError(f"--stream-webhook-key: {path} is not an unencrypted PEM private "
                         f"key ({e})") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise ValueError(f"--stream-webhook-key: {path} holds a "
                         f"{type(private).__name__}, not an Ed25519 key")
    return WebhookKey(private)


def webhook_key_problem(config: Config) -> str | None:
    """What keeps ``--stream-webhook-key`` from being used (the start is
    refused with it, exit 2), or None."""
    if not config.stream_webhook_key:
        return None
    try:
        read_key(config.stream_webhook_key)
    except ValueError as e:
        return str(e)
    return None


KEPT = "stream-webhook.pem"  # in --data-dir, without --stream-webhook-key


class NodeKey:
    """The node's key, read or made the first time it is needed (a node
    whose subscription APIs nobody uses makes none, and says nothing)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._key: WebhookKey | None = None

    @property
    def key(self) -> WebhookKey:
        if self._key is None:
            self._key = webhook_key(self.config)
        return self._key

    @property
    def kid(self) -> str:
        return self.key.kid

    @property
    def jwks(self) -> dict[str, list[dict[str, str]]]:
        return self.key.jwks

    @property
    def token_secret(self) -> bytes:
        return self.key.token_secret

    def signature(self, timestamp: int, body: bytes) -> str:
        return self.key.signature(timestamp, body)


def webhook_key(config: Config) -> WebhookKey:
    """The node's key: ``--stream-webhook-key``'s, else the one ``--data-dir``
    keeps, else one made now (kept there when there is one)."""
    if config.stream_webhook_key:
        return read_key(config.stream_webhook_key)
    kept = Path(config.data_dir) / KEPT if config.data_dir else None
    if kept is not None and kept.exists():
        return read_key(str(kept))
    pem = new_key_pem()
    key = read_key_pem(pem)
    if kept is not None:
        descriptor = os.open(kept, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(pem)
            out.flush()
            os.fsync(out.fileno())
        log.info("stream webhooks: no --stream-webhook-key; signing with a key made now "
                 "(kid {kid}), kept in {path}", kid=key.kid, path=str(kept))
    else:
        log.info("stream webhooks: no --stream-webhook-key; signing with a key made now "
                 "(kid {kid}), which ends with this process", kid=key.kid)
    return key


def read_key_pem(pem: bytes) -> WebhookKey:
    private = serialization.load_pem_private_key(pem, password=None)
    assert isinstance(private, Ed25519PrivateKey)
    return WebhookKey(private)


def new_key_pem() -> bytes:
    """A new Ed25519 private key, PKCS#8 PEM (for ``--stream-webhook-key``)."""
    return Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
