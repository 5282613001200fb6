"""--cluster-secret-file and --publish-token-file: secrets kept out of argv.

Each is also ``PUSHUP_*_FILE`` and a config-file key, with the usual
precedence (flags over environment over file); read through the injected
``read_file``, so no disk is needed.
"""

from __future__ import annotations

import pytest

from pushup.config import ConfigError, load


def read(**contents: bytes):
    def read_file(path: str) -> bytes:
        if path not in contents:
            raise FileNotFoundError(2, "No such file or directory", path)
        return contents[path]
    return read_file


SECRETS = read(s=b"cluster-s3cret\n", t=b"publish-t0ken\r\n", bare=b"bare",
               empty=b"\n", other=b"other\n",
               **{"pushup.toml": b'cluster_secret_file = "other"\n'})


def serve(*flags: str, env: dict[str, str] | None = None):
    return load(["serve", *flags], env or {}, SECRETS)


def refused(*flags: str, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        serve(*flags, env=env)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_flags_read_the_secrets_and_strip_the_trailing_newline():
    config = serve("--cluster-secret-file", "s", "--publish-token-file", "t")
    assert (config.cluster_secret, config.publish_token) == ("cluster-s3cret", "publish-t0ken")
    assert serve("--cluster-secret-file", "bare").cluster_secret == "bare"


def test_environment_and_config_file_forms():
    env = {"PUSHUP_CLUSTER_SECRET_FILE": "s", "PUSHUP_PUBLISH_TOKEN_FILE": "t"}
    config = serve(env=env)
    assert (config.cluster_secret, config.publish_token) == ("cluster-s3cret", "publish-t0ken")
    assert serve("--config", "pushup.toml").cluster_secret == "other"


def test_precedence_holds_across_the_two_forms():
    assert serve("--cluster-secret", "flag", env={"PUSHUP_CLUSTER_SECRET_FILE": "s"}
                 ).cluster_secret == "flag"
    assert serve("--cluster-secret-file", "s", env={"PUSHUP_CLUSTER_SECRET": "env"}
                 ).cluster_secret == "cluster-s3cret"
    assert serve("--config", "pushup.toml", env={"PUSHUP_CLUSTER_SECRET": "env"}
                 ).cluster_secret == "env"


def test_a_secret_and_its_file_in_one_source_are_refused():
    assert "--cluster-secret and --cluster-secret-file" in refused(
        "--cluster-secret", "x", "--cluster-secret-file", "s")
    assert "PUSHUP_PUBLISH_TOKEN and PUSHUP_PUBLISH_TOKEN_FILE" in refused(
        env={"PUSHUP_PUBLISH_TOKEN": "x", "PUSHUP_PUBLISH_TOKEN_FILE": "t"})


def test_unreadable_or_empty_files_are_refused_in_one_line():
    assert "--cluster-secret-file: cannot read missing" in refused(
        "--cluster-secret-file", "missing")
    assert "--publish-token-file: empty is empty" in refused("--publish-token-file", "empty")


def test_a_secret_file_satisfies_the_peer_rule():
    config = serve("--peer", "http://127.0.0.1:1", "--cluster-secret-file", "s")
    assert config.cluster_secret == "cluster-s3cret"
