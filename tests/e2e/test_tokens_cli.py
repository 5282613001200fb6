"""`pushup token`, `pushup --version` and `--subscribe-secret-file`, as a user runs them."""

from __future__ import annotations

import json
import time
import tomllib

import pytest

from pushup._build import COMPILED
from tests.e2e.support import ROOT, assert_error, run_cli, stop, uniq
from tests.toolkit import needs_compiled

SECRET = "e2e-subscribe-secret-0123456789abcdef"


@needs_compiled
def test_version_is_the_package_version():
    result = run_cli("--version")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.returncode == 0
    # this machine has a C compiler: pip install / make built the compiled core
    assert result.stdout.decode().splitlines() == [
        f"pushup {version}", f"core: compiled (mypyc, {len(COMPILED)} modules)"]


def test_version_says_when_the_interpreted_core_runs():
    result = run_cli("--version", env={"PUSHUP_PURE": "1"})
    assert result.returncode == 0
    assert result.stdout.decode().splitlines()[1] == "core: interpreted (PUSHUP_PURE=1)"


def test_a_printed_token_opens_exactly_its_channels(start_node, tmp_path):
    secret_file = tmp_path / "subscribe.secret"
    secret_file.write_text(SECRET + "\n")
    node = start_node("--subscribe-secret-file", str(secret_file))
    room = uniq("room")
    made = run_cli("token", "--channels", f"{room}:*", "--ttl", "600",
                   env={"PUSHUP_SUBSCRIBE_SECRET_FILE": str(secret_file)})
    assert made.returncode == 0, made.stderr
    token = made.stdout.decode().strip()
    pub = node.publish([f"{room}:x"], "hello")
    bearer = {"Authorization": f"Bearer {token}"}
    body = node.subscribe([f"{room}:x"], headers=bearer)
    assert [m["id"] for m in body["messages"]] == [pub["id"]]
    assert_error(node.subscribe_raw([uniq("other")], headers=bearer), 403, "forbidden")
    assert_error(node.subscribe_raw([f"{room}:x"]), 401, "unauthorized")


def test_token_without_a_secret_is_a_one_line_error():
    result = run_cli("token", "--channels", "a")
    assert result.returncode == 2
    err = result.stderr.decode().strip()
    assert "\n" not in err and "secret" in err


@pytest.mark.parametrize("args, said", [
    (("--channels", "news,bad name"), "--channels: 'bad name' is not a valid channel name"),
    (("--channels", "news,,sport"), "--channels: '' is not a valid channel name"),
    (("--channels", "room 1:*"), "--channels: 'room 1:*' is not a valid channel prefix"),
    (("--channels", "news", "--ttl", "0"), "--ttl: a lifetime in seconds above 0, not 0"),
])
def test_token_refuses_a_bad_input_and_names_it(args, said):
    result = run_cli("token", *args, env={"PUSHUP_SUBSCRIBE_SECRET": SECRET})
    assert (result.returncode, result.stdout) == (2, b"")
    err = result.stderr.decode().strip()
    assert "\n" not in err and said in err, err


def test_help_lists_every_command_and_the_version_flag():
    result = run_cli("--help")
    assert result.returncode == 0
    out = result.stdout.decode()
    for command in ("serve", "token", "help", "--version"):
        assert command in out, out
    assert run_cli("help").stdout == result.stdout
    assert b"--channels" in run_cli("help", "token").stdout
    assert b"--max-timeout" in run_cli("help", "serve").stdout


def test_an_unknown_pushup_variable_is_a_warning_and_the_node_serves(start_node):
    node = start_node(env={"PUSHUP_URL": "http://app.example", "PUSHUP_PUBLISH_TOKN": "x"})
    assert node.get("/health").status == 200

    def warnings() -> list[str]:  # printed before the listening line; the pump may lag
        return [line for line in node.stderr_lines if "warning" in line]
    deadline = time.monotonic() + 10
    while len(warnings()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert warnings() == [
        "pushup: warning: unknown environment variable PUSHUP_PUBLISH_TOKN ignored "
        "(did you mean 'PUSHUP_PUBLISH_TOKEN'?)",
        "pushup: warning: unknown environment variable PUSHUP_URL ignored "
        "(did you mean 'PUSHUP_PORT'?)"], node.stderr_lines


def test_json_logs_are_one_object_a_line(start_node):
    node = start_node("--log-format", "json")
    assert stop(node) == 0
    lines = [line for line in node.stderr_lines if line.strip()]
    assert lines
    records = [json.loads(line) for line in lines]
    assert all({"time", "level", "namespace", "message"} <= set(r) for r in records)
    assert any("draining" in r["message"] for r in records)
