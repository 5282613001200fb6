"""pushup/client/tokens.py: ``mint_token`` signs what a node checks, HS256 with
its secret or RS256, ES256 and EdDSA with a private key its JWKS lists (checked
here by the node's own verifier, pushup/http/tokens.py)."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import get_default_algorithms

from pushup.client import mint_token
from pushup.http.tokens import StaticKeys, Verifier, signing_keys

NOW = 1_800_000_000.0
KEYS = {"RS256": lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
        "ES256": lambda: ec.generate_private_key(ec.SECP256R1()),
        "EdDSA": ed25519.Ed25519PrivateKey.generate}


@pytest.mark.parametrize("algorithm", list(KEYS))
def test_a_token_minted_with_a_private_key_opens_a_node_of_its_jwks(algorithm):
    key = KEYS[algorithm]()
    public = get_default_algorithms()[algorithm].to_jwk(key.public_key(), as_dict=True)
    node = Verifier(keys=StaticKeys(signing_keys({"keys": [public | {"kid": "k1"}]})),
                    issuer="https://backend.test", audience="pushup")
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    token = mint_token(pem, ["room:*"], ttl=60, now=NOW, algorithm=algorithm, kid="k1",
                       issuer="https://backend.test", audience="pushup")
    assert node.check(token, ["room:1"], NOW) == NOW + 60


def test_an_hs256_token_is_as_before_and_a_key_needs_its_kid():
    secret = "s" * 32
    assert Verifier(secret).check(mint_token(secret, ["a"], 60, NOW), ["a"], NOW) == NOW + 60
    with pytest.raises(ValueError, match="kid"):
        mint_token(KEYS["EdDSA"](), ["a"], algorithm="EdDSA")
