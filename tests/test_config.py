"""pushup/config/: one validated Config from defaults ← TOML file ← PUSHUP_* env ← flags."""

from __future__ import annotations

import os

import pytest

from pushup.config import (
    Config,
    ConfigError,
    RedisURL,
    build_parser,
    load,
    parse_seeds,
    unknown_environment,
)


def files(**contents: str):
    """A ``read_file`` that serves these TOML texts by path (no disk)."""
    def read(path: str) -> bytes:
        if path not in contents:
            raise FileNotFoundError(2, "No such file or directory", path)
        return contents[path].encode("utf-8")
    return read


def serve(*flags: str, env: dict[str, str] | None = None, toml: str | None = None) -> Config:
    argv = ["serve", *flags]
    read = files(**{"pushup.toml": toml}) if toml is not None else files()
    if toml is not None and "--config" not in flags:
        argv += ["--config", "pushup.toml"]
    return load(argv, env or {}, read)


def refused(*flags: str, env: dict[str, str] | None = None, toml: str | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        serve(*flags, env=env, toml=toml)
    message = str(caught.value)
    assert message.strip(), "a ConfigError needs a message"
    assert "\n" not in message, f"not one line: {message!r}"
    return message


# -- defaults and precedence -----------------------------------------------


def test_defaults():
    config = serve()
    assert config == Config()
    assert (config.host, config.port, config.max_timeout) == ("127.0.0.1", 8080, 120.0)


def test_flags_win_over_env_which_wins_over_the_file():
    toml = 'port = 7000\nmessage_ttl = 10\ncors_origin = "https://file.example"\n'
    env = {"PUSHUP_PORT": "8000", "PUSHUP_MESSAGE_TTL": "20"}
    config = serve("--port", "9000", env=env, toml=toml)
    assert config.port == 9000  # flag over env over file
    assert config.message_ttl == 20.0  # env over file
    assert config.cors_origin == ("https://file.example",)  # file over default


@pytest.mark.parametrize("env, flags, expected", [
    ({}, (), 7000),
    ({"PUSHUP_PORT": "8000"}, (), 8000),
    ({"PUSHUP_PORT": "8000"}, ("--port", "9000"), 9000),
    ({}, ("--port", "9000"), 9000),
])
def test_port_precedence(env, flags, expected):
    assert serve(*flags, env=env, toml="port = 7000").port == expected


def test_every_flag_has_an_environment_variable():
    env = {"PUSHUP_" + name.upper(): value for name, value in {
        "host": "::1", "port": "0", "node_id": "n-1", "publish_token": "t",
        "reactor": "poll", "workers": "2", "message_ttl": "5", "channel_ttl": "6",
        "max_timeout": "7", "cors_origin": "*", "allow_open_publish": "yes",
        "cluster_secret": "s", "peer": "http://127.0.0.1:1",
    }.items()}
    config = serve(env=env)
    assert (config.host, config.port, config.node_id) == ("::1", 0, "n-1")
    assert config.publish_token == "t"
    assert (config.reactor, config.workers) == ("poll", 2)
    assert (config.message_ttl, config.channel_ttl, config.max_timeout) == (5.0, 6.0, 7.0)
    assert (config.cors_origin, config.allow_open_publish) == (("*",), True)
    assert config.peer == ("http://127.0.0.1:1",)


def test_config_file_from_the_environment():
    read = files(**{"/etc/pushup.toml": "port = 7001", "other.toml": "port = 7002"})
    assert load(["serve"], {"PUSHUP_CONFIG": "/etc/pushup.toml"}, read).port == 7001
    assert load(["serve", "--config", "other.toml"],
                {"PUSHUP_CONFIG": "/etc/pushup.toml"}, read).port == 7002


def test_toml_values_keep_their_types():
    config = serve(toml='max_timeout = 30\nmax_channels = 8\nallow_open_publish = true\n'
                        'host = "0.0.0.0"\n')
    assert config.max_timeout == 30.0 and isinstance(config.max_timeout, float)
    assert config.max_channels == 8
    assert config.allow_open_publish is True


def test_workers_auto_is_the_cpu_count():
    assert serve("--workers", "auto").workers == min(os.cpu_count() or 1, 64)


# -- booleans ----------------------------------------------------------------


@pytest.mark.parametrize("text", ["1", "true", "yes", "TRUE", "Yes", " true "])
def test_boolean_env_true(text):
    assert serve(env={"PUSHUP_ALLOW_OPEN_PUBLISH": text}).allow_open_publish is True


@pytest.mark.parametrize("text", ["0", "false", "no", "FALSE", "No"])
def test_boolean_env_false(text):
    assert serve(env={"PUSHUP_ALLOW_OPEN_PUBLISH": text}).allow_open_publish is False


@pytest.mark.parametrize("text", ["maybe", "2", "y e s", "truee"])
def test_boolean_env_garbage_is_refused(text):
    assert "PUSHUP_ALLOW_OPEN_PUBLISH" in refused(env={"PUSHUP_ALLOW_OPEN_PUBLISH": text})


def test_boolean_flag_and_toml():
    assert serve("--allow-open-publish").allow_open_publish is True
    assert serve(toml="allow_open_publish = true").allow_open_publish is True
    assert serve(toml="allow_open_publish = false").allow_open_publish is False
    refused(toml='allow_open_publish = "perhaps"')


# -- peers -------------------------------------------------------------------


def test_peer_list_from_toml():
    config = serve(toml='peer = ["http://10.0.0.1:8080", "http://10.0.0.2:8080"]\n'
                        'cluster_secret = "s"\npublish_token = "t"\n')
    assert config.peer == ("http://10.0.0.1:8080", "http://10.0.0.2:8080")


def test_peer_flag_is_repeatable_and_keeps_order():
    config = serve("--peer", "http://b:2", "--peer", "http://a:1", "--cluster-secret", "s")
    assert config.peer == ("http://b:2", "http://a:1")


def test_peer_env_is_comma_separated():
    env = {"PUSHUP_PEER": "http://a:1, http://b:2", "PUSHUP_CLUSTER_SECRET": "s"}
    assert serve(env=env).peer == ("http://a:1", "http://b:2")


def test_peer_flags_replace_peers_from_env_and_file():
    env = {"PUSHUP_PEER": "http://env:1", "PUSHUP_CLUSTER_SECRET": "s"}
    config = serve("--peer", "http://flag:1", env=env, toml='peer = ["http://file:1"]')
    assert config.peer == ("http://flag:1",)


@pytest.mark.parametrize("source", [
    {"flags": ("--peer", "http://127.0.0.1:8081")},
    {"env": {"PUSHUP_PEER": "http://127.0.0.1:8081"}},
    {"toml": 'peer = ["http://127.0.0.1:8081"]'},
    {"flags": ("--peer", "http://127.0.0.1:8081", "--cluster-secret", "")},
])
def test_peer_without_cluster_secret_is_refused(source):
    message = refused(*source.get("flags", ()), env=source.get("env"), toml=source.get("toml"))
    assert message == (
        "peer (--peer, PUSHUP_PEER or peer in the config file) needs cluster_secret "
        "(--cluster-secret, PUSHUP_CLUSTER_SECRET or cluster_secret in the config file): "
        "peers always authenticate each other")


@pytest.mark.parametrize(("given", "settings"), [
    ({"env": {"PUSHUP_ADMIN_PORT": "8080"}}, ("admin_port", "port")),
    ({"toml": "max_message_bytes = 100\nmax_cached_bytes = 10"},
     ("max_message_bytes", "max_cached_bytes")),
    ({"env": {"PUSHUP_DATA_DIR": "/d"}, "toml": "workers = 2"}, ("data_dir", "workers")),
    ({"toml": 'data_dir = "/d"\nengine = "redis://127.0.0.1:6379"'}, ("data_dir", "engine")),
    ({"env": {"PUSHUP_ENGINE": "redis://127.0.0.1:6379", "PUSHUP_PEER": "http://a:1",
              "PUSHUP_CLUSTER_SECRET": "s"}}, ("peer", "engine")),
    ({"env": {"PUSHUP_HOST": "0.0.0.0"}}, ("publish_token", "allow_open_publish")),
])
def test_a_rule_between_settings_names_each_as_flag_variable_and_file_key(given, settings):
    """The settings of a rule may come from different sources (here the
    environment or the file, never a flag): the message spells each all ways."""
    message = refused(env=given.get("env"), toml=given.get("toml"))
    for name in settings:
        assert (f"{name} (--{name.replace('_', '-')}, PUSHUP_{name.upper()} or {name} in the "
                "config file)") in message, message


def test_data_dir_comes_from_flag_env_and_file():
    assert serve("--data-dir", "/var/lib/pushup").data_dir == "/var/lib/pushup"
    assert serve(env={"PUSHUP_DATA_DIR": "/d"}).data_dir == "/d"
    assert serve(toml='data_dir = "/t"').data_dir == "/t"


def test_data_dir_is_refused_beside_workers():
    assert refused("--data-dir", "/d", "--workers", "2").startswith(
        "data_dir (--data-dir, PUSHUP_DATA_DIR or data_dir in the config file) is for a single "
        "process")


def test_data_dir_is_refused_on_redis():
    assert refused("--data-dir", "/d", "--engine", "redis://127.0.0.1:6379").startswith(
        "data_dir (--data-dir, PUSHUP_DATA_DIR or data_dir in the config file) is for a single "
        "node")


def test_a_mesh_node_keeps_its_streams_in_a_data_dir():
    config = serve("--data-dir", "/d", "--peer", "http://127.0.0.1:8081",
                   "--cluster-secret", "s")
    assert (config.data_dir, config.peer) == ("/d", ("http://127.0.0.1:8081",))


def test_advertise_url_that_is_not_an_http_url_is_refused():
    refused("--advertise-url", "127.0.0.1:8080")


def test_peer_that_is_not_an_http_url_is_refused():
    refused("--peer", "127.0.0.1:8081", "--cluster-secret", "s")
    refused("--peer", "ftp://x", "--cluster-secret", "s")


# -- open publishing on public addresses -------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "", "example.com"])
def test_public_host_without_token_is_refused(host):
    message = refused("--host", host)
    assert "publish-token" in message


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5"])
def test_public_host_with_token_or_explicit_open_publish_is_accepted(host):
    assert serve("--host", host, "--publish-token", "t").publish_token == "t"
    assert serve("--host", host, "--allow-open-publish").allow_open_publish is True
    assert serve("--host", host, env={"PUSHUP_ALLOW_OPEN_PUBLISH": "1"}).host == host


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.9.9", "::1", "localhost"])
def test_loopback_host_needs_no_token(host):
    assert serve("--host", host).host == host


# -- invalid values ----------------------------------------------------------


@pytest.mark.parametrize("flags", [
    ("--port", "abc"), ("--port", "70000"), ("--port", "-1"), ("--port", "80.5"),
    ("--workers", "0"), ("--workers", "65"), ("--workers", "many"),
    ("--message-ttl", "0"), ("--message-ttl", "nan"), ("--channel-ttl", "inf"),
    ("--max-timeout", "-5"), ("--max-timeout", "soon"),
    ("--reactor", "kqueue"), ("--log-level", "loud"),
    ("--node-id", "bad id"), ("--node-id", "a.b"), ("--node-id", "x" * 65),
    ("--max-body-bytes", "0"), ("--max-body-bytes", "1.5"), ("--max-connections", "0"),
    ("--max-message-bytes", "100", "--max-cached-bytes", "10"),
    ("--bogus",), ("--port",),
])
def test_invalid_flag_is_one_line_config_error(flags):
    refused(*flags)


def test_missing_command_is_a_config_error():
    with pytest.raises(ConfigError):
        load([], {})
    with pytest.raises(ConfigError):
        load(["run"], {})


@pytest.mark.parametrize("env", [{"PUSHUP_PORT": "x"}, {"PUSHUP_PORT": ""},
                                 {"PUSHUP_MAX_TIMEOUT": "NaN"}, {"PUSHUP_WORKERS": "-2"}])
def test_invalid_env_value_is_one_line_config_error(env):
    refused(env=env)


@pytest.mark.parametrize("toml", [
    "port = ",                 # not TOML
    "port = 1\nport = 2",       # duplicate key
    "colour = 'blue'",         # unknown setting
    'port = "x"', "port = true", "port = 1.5", "host = 5", "max_timeout = 'soon'",
    "peer = [1, 2]\ncluster_secret = 's'",
    "max_timeout = nan",
])
def test_invalid_toml_is_one_line_config_error(toml):
    refused(toml=toml)


def test_unreadable_config_file_is_a_config_error():
    message = refused("--config", "missing.toml")
    assert "missing.toml" in message


def test_non_utf8_config_file_is_a_config_error():
    with pytest.raises(ConfigError) as caught:
        load(["serve", "--config", "f"], {}, lambda path: b"port = \xff")
    assert "\n" not in str(caught.value)


def test_an_unknown_environment_variable_is_a_warning_naming_the_closest_setting():
    env = {"PUSHUP_PUBLISH_TOKN": "x", "PUSHUP_URL": "http://app", "PUSHUP_PORT": "8001"}
    assert load(["serve"], env).port == 8001
    assert unknown_environment(env) == [
        "unknown environment variable PUSHUP_PUBLISH_TOKN ignored "
        "(did you mean 'PUSHUP_PUBLISH_TOKEN'?)",
        "unknown environment variable PUSHUP_URL ignored (did you mean 'PUSHUP_PORT'?)"]
    assert unknown_environment({"PUSHUP_WORKER_INDEX": "1", "PUSHUP_CONFIG": "f"}) == []


@pytest.mark.parametrize("toml, said", [
    ('port = "x"', "config file pushup.toml, key port: invalid value 'x'"),
    ("max_timeout = 'soon'", "config file pushup.toml, key max_timeout: invalid value 'soon'"),
    ("allow_open_publish = 'maybe'", "config file pushup.toml, key allow_open_publish"),
])
def test_a_type_error_in_the_config_file_names_the_file_and_key(toml, said):
    assert said in refused(toml=toml)


def test_a_type_error_names_the_variable_or_flag_it_came_from():
    assert refused(env={"PUSHUP_PORT": "x"}).startswith("PUSHUP_PORT: invalid value")
    assert refused("--port", "x", toml="port = 1").startswith("--port: invalid value")


def test_a_misspelt_config_key_gets_a_hint():
    with pytest.raises(ConfigError, match="'max_conections'.*did you mean 'max_connections'"):
        load(["serve", "--config", "f.toml"], {}, read_file=lambda p: b"max_conections = 5\n")


def test_serve_help_shows_each_default_and_environment_variable(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[default 8080; env PUSHUP_PORT]" in text
    assert "[env PUSHUP_PUBLISH_TOKEN]" in text


def test_the_engine_is_mesh_or_a_redis_url():
    assert serve().engine == "mesh"
    assert serve("--engine", "redis://10.0.0.5:6380/2").engine == "redis://10.0.0.5:6380/2"
    assert serve(env={"PUSHUP_REDIS_MAXLEN": "500"}).redis_maxlen == 500
    assert "--engine: bad Redis URL" in refused("--engine", "http://127.0.0.1:6379")
    assert "peer (--peer, PUSHUP_PEER or peer in the config file) is for the mesh" in refused(
        "--engine", "redis://127.0.0.1:6379", "--peer", "http://127.0.0.1:8081",
        "--cluster-secret", "s")

def test_publish_ack_is_peer_by_default_and_only_peer_all_or_local():
    assert load(["serve"], {}).publish_ack == "peer"
    assert load(["serve", "--publish-ack", "local"], {}).publish_ack == "local"
    assert load(["serve", "--publish-ack", "all"], {}).publish_ack == "all"
    assert load(["serve"], {"PUSHUP_PUBLISH_ACK_TIMEOUT": "0.5"}).publish_ack_timeout == 0.5
    assert "peer, all or local" in refused("--publish-ack", "one")
    refused("--publish-ack-timeout", "0")


def test_cors_origin_takes_several_origins_repeated_or_as_a_comma_list():
    assert serve("--cors-origin", "http://localhost:8000",
                 "--cors-origin", "http://127.0.0.1:8000,https://app.example").cors_origin == (
        "http://localhost:8000", "http://127.0.0.1:8000", "https://app.example")
    env = {"PUSHUP_CORS_ORIGIN": "http://a.example, http://b.example"}
    assert serve(env=env).cors_origin == ("http://a.example", "http://b.example")
    toml = 'cors_origin = ["http://a.example", "http://b.example:81"]'
    assert serve(toml=toml).cors_origin == ("http://a.example", "http://b.example:81")


@pytest.mark.parametrize("given, why", [
    ("localhost", "is not an origin"),
    ("http://a.example/app", "is not an origin"),
    ("*,http://a.example", "give it alone"),
])
def test_a_cors_origin_that_no_browser_sends_is_refused(given, why):
    with pytest.raises(ConfigError, match=why):
        serve("--cors-origin", given)


def test_the_redis_engine_takes_one_url_or_several_seeds():
    assert parse_seeds("redis://10.0.0.5:6380/2") == [RedisURL("10.0.0.5", 6380, db=2)]
    assert parse_seeds("unix:///run/redis.sock") == [RedisURL(path="/run/redis.sock")]
    assert parse_seeds("redis://alice:p%40ss@10.0.0.1:7000,10.0.0.2,[::1]:7002/0") == [
        RedisURL("10.0.0.1", 7000, username="alice", password="p@ss"),
        RedisURL("10.0.0.2", 6379, username="alice", password="p@ss"),
        RedisURL("::1", 7002, username="alice", password="p@ss")]
    assert parse_seeds("redis://a:1,b:2/3") == [RedisURL("a", 1, db=3), RedisURL("b", 2, db=3)]
    seeds = "redis://127.0.0.1:7000,127.0.0.1:7001"
    assert serve("--engine", seeds).engine == seeds
    assert "an empty HOST:PORT between commas" in refused("--engine", "redis://a:1,,b:2")
    assert "Port could not be cast" in refused("--engine", "redis://:secret@a:1,b:x")
    assert "secret" not in refused("--engine", "redis://:secret@a:1,b:x")
