"""What `pushup` says to the person typing it: `pushup token --help` reads as
plain text with its defaults; a mistyped flag is named with the closest one
(exit 2); a subscribe secret shorter than HS256 wants is one line of ours, at
start, not PyJWT's Python warning with a source line; `pushup token --sub
--info` writes the claims presence reads, and refuses an info a node would
(exit 2). Real subprocesses."""
from __future__ import annotations

import subprocess
import sys
import urllib.request

import jwt
import pytest

from tests.toolkit import ROOT, clean_env

SHORT = "short-secret"  # 12 bytes: under HS256's 32
SHORT_SAID = ("the subscribe secret is 12 bytes long; HS256 wants 32 or more (RFC 7518, "
              "section 3.2), or its tokens are easier to forge")


def pushup(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pushup", *args], capture_output=True,
                          text=True, env=clean_env(env), cwd=ROOT, timeout=60)


def test_token_help_is_plain_text_and_shows_the_ttl_default():
    done = pushup("token", "--help")
    assert done.returncode == 0 and done.stderr == ""
    text = done.stdout
    assert "`" not in text and "%(" not in text, text
    assert " ".join(text.split("\n\n")[0].split()) == (
        "usage: pushup token [-h] [--channels NAMES] [--ttl SECONDS] [--secret-file FILE] "
        "[--key-file PEM] [--kid KID] [--issuer ISS] [--audience AUD] [--sub USER] "
        "[--info JSON] [--jwks]"), text
    ttl = " ".join(text.split("--ttl SECONDS", 2)[2].split("\n  --")[0].split())
    assert ttl == "lifetime of the token in seconds (default 3600)", text


def test_no_help_shows_raw_markup():
    for command in (("--help",), ("serve", "--help"), ("token", "--help"), ("help", "token")):
        done = pushup(*command)
        assert done.returncode == 0 and done.stdout, command
        assert "`" not in done.stdout and "%(" not in done.stdout, (command, done.stdout)


def test_a_mistyped_flag_is_named_with_the_closest_one():
    done = pushup("serve", "--prot", "1")
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", "pushup: error: unknown flag --prot; did you mean --port?\n")
    done = pushup("serve", "--port", "0", "--max-timout=30")
    assert (done.returncode, done.stderr) == (
        2, "pushup: error: unknown flag --max-timout; did you mean --max-timeout?\n")
    # a mistyped flag is named first, even when it makes a required one missing
    done = pushup("token", "--chanels", "news", env={"PUSHUP_SUBSCRIBE_SECRET": "s" * 32})
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", "pushup token: error: unknown flag --chanels; did you mean --channels?\n")


def test_a_short_secret_is_one_line_of_ours_from_token():
    done = pushup("token", "--channels", "news", env={"PUSHUP_SUBSCRIBE_SECRET": SHORT})
    assert done.returncode == 0 and done.stdout.count(".") == 2  # a JWT
    assert done.stderr == f"pushup token: warning: {SHORT_SAID}\n"
    done = pushup("token", "--channels", "news", env={"PUSHUP_SUBSCRIBE_SECRET": "s" * 32})
    assert done.returncode == 0 and done.stderr == ""


def test_a_short_secret_is_one_line_of_ours_from_a_node_checking_tokens(serve):
    token = pushup("token", "--channels", "news",
                   env={"PUSHUP_SUBSCRIBE_SECRET": SHORT}).stdout.strip()
    node = serve(env={"PUSHUP_SUBSCRIBE_SECRET": SHORT})
    # a token checked (where PyJWT would warn), twice
    for _ in range(2):
        with urllib.request.urlopen(f"{node.url}/subscribe?channels=news"
                                    f"&timeout=1&token={token}", timeout=15) as r:
            assert r.status == 200
    assert node.stop() == 0
    lines = node.lines()
    assert lines[0] == f"pushup: warning: {SHORT_SAID}", lines
    assert not [line for line in lines[1:] if "warning" in line.lower() or "jwt" in line], lines


def test_token_writes_the_sub_and_info_claims_presence_reads():
    secret = "s" * 32
    done = pushup("token", "--channels", "room:*", "--sub", "ann",
                  "--info", '{"name": "Ann", "avatar": "https://example.com/a.png"}',
                  env={"PUSHUP_SUBSCRIBE_SECRET": secret})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    claims = jwt.decode(done.stdout.strip(), secret, algorithms=["HS256"])
    assert claims["sub"] == "ann"
    assert claims["info"] == {"name": "Ann", "avatar": "https://example.com/a.png"}
    assert claims["channels"] == ["room:*"]
    # neither given: neither claim
    plain = pushup("token", "--channels", "news", env={"PUSHUP_SUBSCRIBE_SECRET": secret})
    assert {"sub", "info"}.isdisjoint(jwt.decode(plain.stdout.strip(), secret,
                                                 algorithms=["HS256"]))


@pytest.mark.parametrize(("flags", "said"), [
    (("--info", "{name: Ann}"), "--info: not JSON (Expecting property name enclosed in double "
     "quotes: line 1 column 2 (char 1)): '{name: Ann}'"),
    (("--info", '["Ann"]'), "--info: a JSON object ({...}), not an array: '[\"Ann\"]'"),
    (("--info", '{"bio": "' + "x" * 1100 + '"}'),
     "--info: 1110 bytes as JSON; a node takes 1024 at most"),
    (("--sub", ""), "--sub: a user is 1 to 200 characters, not 0"),
    (("--sub", "u" * 201), "--sub: a user is 1 to 200 characters, not 201"),
])
def test_token_refuses_a_sub_or_info_a_node_would_refuse(flags, said):
    done = pushup("token", "--channels", "news", *flags,
                  env={"PUSHUP_SUBSCRIBE_SECRET": "s" * 32})
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"pushup token: error: {said}\n")
