"""Secrets stay off command lines: --workers hands them over in the environment,
and --cluster-secret-file / --publish-token-file read them from files."""
from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path

from tests.e2e.support import PUSHUP, Node, run_cli, spawn, uniq
from tests.toolkit import ServedNode, children


def cmdlines() -> dict[int, bytes]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                pass
    return out


def test_workers_get_the_secrets_without_any_command_line_showing_them(tmp_path):
    cluster_secret = "cs-" + secrets.token_hex(16)
    token = "pt-" + secrets.token_hex(16)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    served = ServedNode("--workers", "2", "--publish-token-file", str(token_file), port=0,
                        program=[PUSHUP], env={"PUSHUP_CLUSTER_SECRET": cluster_secret})
    proc = served.proc
    try:
        node = Node(proc, served.host, served.port, (), served)
        workers = children(proc.pid)
        assert len(workers) == 2, workers
        for pid, cmdline in cmdlines().items():
            assert cluster_secret.encode() not in cmdline, (pid, cmdline)
            assert token.encode() not in cmdline, (pid, cmdline)
        for pid in workers:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert f"PUSHUP_CLUSTER_SECRET={cluster_secret}".encode() in environ
            assert f"PUSHUP_PUBLISH_TOKEN={token}".encode() in environ
        # Both workers use the token (each request may land on either).
        ch = uniq("sec")
        for _ in range(6):
            assert node.publish_raw([ch], 1).status == 401
            assert node.publish_raw([ch], 1, token=token).status == 201
    finally:
        assert served.stop(signal.SIGTERM, 15) == 0, served.lines()[-10:]
        served.log.unlink(missing_ok=True)


def test_secret_files_work_for_one_node(tmp_path):
    (tmp_path / "secret").write_text("file-secret\n")
    (tmp_path / "token").write_text("file-token\n")
    n = spawn("--cluster-secret-file", str(tmp_path / "secret"),
              "--publish-token-file", str(tmp_path / "token"))
    try:
        ch = uniq("file")
        assert n.publish_raw([ch], 1, token="file-token").status == 201  # newline stripped
        assert n.publish_raw([ch], 1).status == 401
    finally:
        n.proc.send_signal(signal.SIGTERM)
        assert n.proc.wait(15) == 0


def test_env_file_forms_work(tmp_path):
    (tmp_path / "token").write_text("env-file-token")
    n = spawn(env={"PUSHUP_PUBLISH_TOKEN_FILE": str(tmp_path / "token")})
    try:
        assert n.publish_raw([uniq("env")], 1, token="env-file-token").status == 201
        assert n.publish_raw([uniq("env")], 1).status == 401
    finally:
        n.proc.send_signal(signal.SIGTERM)
        assert n.proc.wait(15) == 0


def test_an_unreadable_or_empty_secret_file_is_a_one_line_error_exit_2(tmp_path):
    (tmp_path / "empty").write_text("\n")
    for flag, path in (("--cluster-secret-file", tmp_path / "missing"),
                       ("--publish-token-file", tmp_path / "empty"),
                       ("--publish-token-file", tmp_path)):
        r = run_cli("serve", "--port", "0", flag, str(path))
        assert r.returncode == 2, r
        lines = r.stderr.decode().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"pushup: error: {flag}"), lines
