"""``--subscribe-jwks URL`` on a real node: subscribers present RS256 tokens
minted by ``pushup token --key-file``, verified against the JWKS a real HTTP
server of this test serves; the identity provider rotates its key (a new kid,
the old one withdrawn) and the node picks the new one up on its next fetch;
with the JWKS endpoint down, a token of a kid never served is 401 at once and
the node keeps serving the keys it has."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.e2e.support import assert_error, run_cli, uniq, wait_until

ISSUER = "https://idp.test"
AUDIENCE = "pushup"


class KeyServer:
    """A JWKS at ``url``, the set the test says, and how often it was fetched."""

    def __init__(self) -> None:
        self.jwks: dict = {"keys": []}
        self.fetches = 0
        keys = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                keys.fetches += 1
                body = json.dumps(keys.jwks).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def key_file(tmp_path, name: str) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path / f"{name}.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return str(path)


def cli(*args: str) -> str:
    made = run_cli("token", *args)
    assert made.returncode == 0, made.stderr
    return made.stdout.decode().strip()


def token(pem: str, kid: str, channels: str) -> dict[str, str]:
    """The Authorization header of an RS256 token, as the identity provider signs it."""
    signed = cli("--key-file", pem, "--kid", kid, "--channels", channels, "--ttl", "600",
                 "--issuer", ISSUER, "--audience", AUDIENCE)
    return {"Authorization": f"Bearer {signed}"}


def test_rs256_tokens_verify_against_a_jwks_url_through_a_key_rotation(start_node, tmp_path):
    first, second, never = (key_file(tmp_path, n) for n in ("first", "second", "never"))
    idp = KeyServer()
    try:
        idp.jwks = json.loads(cli("--key-file", first, "--kid", "k1", "--jwks"))
        node = start_node("--subscribe-jwks", idp.url, "--subscribe-jwks-refresh", "1",
                          "--subscribe-issuer", ISSUER, "--subscribe-audience", AUDIENCE)
        room = uniq("room")
        sent = node.publish([f"{room}:a"], "hello")
        bearer = token(first, "k1", f"{room}:*")
        got = node.subscribe([f"{room}:a"], since="0", headers=bearer)
        assert [m["id"] for m in got["messages"]] == [sent["id"]]
        assert_error(node.subscribe_raw([uniq("other")], headers=bearer), 403, "forbidden")
        assert_error(node.subscribe_raw([f"{room}:a"]), 401, "unauthorized")
        # signed by a key the JWKS does not hold, under the listed kid: forged
        assert_error(node.subscribe_raw([f"{room}:a"], headers=token(never, "k1", room + ":*")),
                     401, "unauthorized")

        # the provider rotates: k2 replaces k1, and tokens signed by k2 open once fetched
        idp.jwks = json.loads(cli("--key-file", second, "--kid", "k2", "--jwks"))
        rotated = token(second, "k2", f"{room}:*")
        answered = wait_until(
            lambda: (lambda r: r if r.status == 200 else None)(
                node.subscribe_raw([f"{room}:a"], since="0", headers=rotated)),
            10.0, msg="a token of the new kid accepted")
        assert [m["id"] for m in answered.json["messages"]] == [sent["id"]]
        # the withdrawn key's token, accepted before, is refused now
        assert_error(node.subscribe_raw([f"{room}:a"], headers=bearer), 401, "unauthorized")
        assert sum("keys k2" in line for line in node.stderr_lines) == 1, node.stderr_lines

        # the JWKS endpoint goes down: an unknown kid is 401 (never a hang), the
        # node logs the failure once and keeps serving k2's tokens
        idp.close()
        unknown = token(never, "k3", f"{room}:*")

        def refused_and_said() -> bool:
            assert_error(node.subscribe_raw([f"{room}:a"], headers=unknown, http_timeout=10),
                         401, "unauthorized")
            return any("cannot fetch the keys" in line for line in node.stderr_lines)

        wait_until(refused_and_said, 10.0, msg="the failed fetch logged")
        assert_error(node.subscribe_raw([f"{room}:a"], headers=unknown), 401, "unauthorized")
        assert node.subscribe([f"{room}:a"], since="0", headers=rotated)["messages"]
        # said once, not once a request (a fetch cut as the server closed may say
        # another error first: each is said once)
        said = [line.split("] ", 1)[1] for line in node.stderr_lines
                if "cannot fetch the keys" in line]
        assert len(said) == len(set(said)), said
        assert node.get("/health").status == 200
    finally:
        idp.close()


def test_a_jwks_file_without_a_usable_key_stops_the_start(tmp_path):
    path = tmp_path / "keys.json"
    path.write_text('{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "s"}]}')
    result = run_cli("serve", "--port", "0", "--subscribe-jwks", str(path))
    assert result.returncode == 2
    assert result.stderr.decode().splitlines() == [
        f"pushup: error: --subscribe-jwks: {path}: no key with a kid for RS256, ES256, "
        "EdDSA in the key set"]
