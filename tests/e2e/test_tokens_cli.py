"""`pushup token`, `pushup --version` and `--subscribe-secret-file`, as a user runs them."""

from __future__ import annotations

import tomllib

from pushup_e2e import ROOT, assert_error, run_cli, uniq

SECRET = "e2e-subscribe-secret-0123456789abcdef"


def test_version_is_the_package_version():
    result = run_cli("--version")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert result.returncode == 0
    assert result.stdout.decode().strip() == f"pushup {version}"


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


def test_json_logs_are_one_object_a_line(start_node):
    import json

    from pushup_e2e import stop

    node = start_node("--log-format", "json")
    assert stop(node) == 0
    lines = [line for line in node.stderr_lines if line.strip()]
    assert lines
    records = [json.loads(line) for line in lines]
    assert all(set(r) == {"time", "level", "namespace", "message"} for r in records)
    assert any("draining" in r["message"] for r in records)
