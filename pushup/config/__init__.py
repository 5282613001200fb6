"""One validated ``Config`` from defaults, a TOML file, the environment and flags.

Precedence: flags win over ``PUSHUP_*`` environment variables, which win
over the ``--config`` TOML file, which wins over the defaults below. Any
invalid value raises ``ConfigError`` with a one-line message naming where it
was given (a rule between settings names each setting in all three spellings,
``spelled``, since they may come from different sources); the CLI turns that
into exit code 2. An unknown ``PUSHUP_*`` variable is only a warning
(``unknown_environment``). Nothing here starts the reactor or opens a socket.
Where Redis is (the URLs ``--engine`` takes) is :mod:`pushup.config.redis_url`.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

# Where Redis is (--engine redis://...): its own module, re-exported here, where
# the Redis engine and the tests import it from.
from pushup.config.redis_url import REDIS_PORT as REDIS_PORT
from pushup.config.redis_url import RedisURL as RedisURL
from pushup.config.redis_url import parse_seeds as parse_seeds
from pushup.config.redis_url import parse_url as parse_url
from pushup.config.sizes import parse_size
from pushup.core.model import check_node_id


class ConfigError(Exception):
    """Invalid configuration; the message is one line for the operator."""


@dataclass(frozen=True, slots=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 8080
    node_id: str = ""  # empty: the data dir's, else <hostname>-<port> (random with port 0)
    peer: tuple[str, ...] = ()
    advertise_url: str = ""  # empty: http://HOST:PORT
    engine: str = "mesh"
    redis_maxlen: int = 100_000
    # A node follows whole partitions: with more channels than partitions,
    # every node would follow every one (docs/scaling.md, measured)
    redis_partitions: int = 1024
    cluster_secret: str = ""
    publish_token: str = ""
    subscribe_secret: str = ""
    # Subscriber tokens of the ecosystem (docs/api.md, Security): a previous HS256
    # secret during a rotation, public keys from a JWKS, and the iss / aud required.
    subscribe_secret_previous: str = ""
    subscribe_jwks: str = ""  # a JWKS file, or an http(s) URL fetched and refreshed
    subscribe_jwks_refresh: float = 60.0
    subscribe_issuer: str = ""
    subscribe_audience: str = ""
    reactor: str = "epoll"
    workers: int = 1
    message_ttl: float = 3600.0
    channel_ttl: float = 3600.0
    max_timeout: float = 120.0
    cors_origin: tuple[str, ...] = ()  # origins a browser page may call from, or ("*",)
    allow_open_publish: bool = False
    max_body_bytes: int = 1024 * 1024
    max_message_bytes: int = 64 * 1024
    max_channels: int = 64
    max_limit: int = 1000
    max_messages_per_channel: int = 1000
    max_cached_bytes: int = 256 * 1024 * 1024
    max_connections: int = 16000
    max_response_bytes: int = 1024 * 1024
    stream_retention_age: int = 0  # a PUT without Stream-Retention-Age gets this (0: none)
    stream_retention_bytes: int = 0  # and its Stream-Retention-Bytes (0: none)
    header_timeout: float = 10.0
    keepalive_timeout: float = 60.0
    send_timeout: float = 30.0
    peer_queue: int = 10_000
    publish_ack: str = "peer"
    publish_ack_timeout: float = 2.0
    idempotency_window: float = 600.0  # seconds an Idempotency-Key is remembered
    log_level: str = "info"
    log_format: str = "text"
    data_dir: str = ""  # empty: the cache lives in memory only
    admin_port: int = 0  # 0: /stats and /metrics on the client port
    admin_host: str = "127.0.0.1"
    # Drain (docs/operations.md, "Draining without a reconnect storm"): event
    # streams end spread over this many seconds after SIGTERM (0: all at once)
    drain_window: float = 0.0

    @property
    def subscribers_need_tokens(self) -> bool:
        return bool(self.subscribe_secret or self.subscribe_jwks)

    # Presence, occupancy and webhooks (docs/api.md, "Presence"); a webhook URL implies presence
    presence: bool = False
    presence_window: float = 0.0  # 0: max_timeout + 5 s
    presence_members: int = 100  # members GET /presence lists per channel at most
    webhook_url: tuple[str, ...] = ()
    webhook_secret: str = ""
    webhook_queue: int = 10_000  # events queued per URL; past it the oldest are dropped
    # Durable Streams subscriptions (docs/api.md, "Stream subscriptions"): the
    # Ed25519 key webhook deliveries are signed with, and their bounded queue
    stream_webhook_key: str = ""  # PEM file; empty: a key made at start
    stream_webhook_queue: int = 10_000  # deliveries waiting for a connection; past it refused

    @property
    def presence_on(self) -> bool:
        return self.presence or bool(self.webhook_url)

    @property
    def presence_linger(self) -> float:
        """Seconds a released subscription stays counted."""
        return self.presence_window or self.max_timeout + 5.0


REACTORS = ("epoll", "poll", "select")
LOG_LEVELS = ("debug", "info", "warn", "error", "critical")
PUBLISH_ACKS = ("peer", "all", "local")
MAX_DRAIN_WINDOW = 3600.0  # an hour: past that a drain is a stuck shutdown
# Every option: (help, metavar). Types come from the Config annotations.
_HELP: dict[str, tuple[str, str | None]] = {
    "host": ("address to listen on", "HOST"),
    "port": ("port to listen on (0: any free port)", "PORT"),
    "node_id": ("this node's id (letters, digits, _ and -); default: the one stored in "
                "--data-dir, else HOSTNAME-PORT (random with --port 0), so a restart keeps "
                "it", "ID"),
    "peer": ("base URL of another node of the cluster (repeatable)", "URL"),
    "advertise_url": ("this node's base URL as the other nodes' --peer name it (default "
                      "http://HOST:PORT): on the mesh, each Durable Stream is held by one "
                      "node, chosen from these URLs; on Redis, the others reach it there "
                      "when it holds the stream subscriptions", "URL"),
    "engine": ("what carries the cluster: mesh (peers, --peer) or "
               "redis://HOST:PORT[,HOST:PORT...][/DB] (one redis-server, or seeds of a "
               "Redis Cluster)", "ENGINE"),
    "redis_maxlen": ("entries the Redis log keeps (about; older ones are trimmed)", "N"),
    "redis_partitions": ("channels are hashed over this many partitions of the Redis log, "
                         "each in one Cluster slot; a node follows those its clients read; "
                         "every node of a cluster must say the same", "K"),
    "cluster_secret": ("shared secret peers authenticate with", "S"),
    "publish_token": ("bearer token required to publish and manage channels", "T"),
    "subscribe_secret": ("HS256 secret of the JWTs subscribers must present (pushup token)",
                         "S"),
    "subscribe_secret_previous": ("the previous --subscribe-secret, still accepted during a "
                                  "rotation (tokens signed with either verify)", "S"),
    "subscribe_jwks": ("public keys of RS256, ES256 and EdDSA subscriber tokens, by kid: a "
                       "JWKS file (read at start) or an http(s) URL (fetched, cached, "
                       "refreshed)", "FILE_OR_URL"),
    "subscribe_jwks_refresh": ("seconds the keys of a --subscribe-jwks URL are kept before "
                               "a fetch; a token of an unknown kid fetches at most once "
                               "per this time", "SECONDS"),
    "subscribe_issuer": ("subscriber tokens must carry this iss claim", "ISS"),
    "subscribe_audience": ("subscriber tokens must carry this aud claim", "AUD"),
    "reactor": ("event loop: epoll, poll or select", "NAME"),
    "workers": ("processes sharing the port (a number, or auto)", "N"),
    "message_ttl": ("seconds a message is kept", "SECONDS"),
    "channel_ttl": ("seconds a channel lives without publishes or subscribers", "SECONDS"),
    "max_timeout": ("longest hold of a subscribe, in seconds", "SECONDS"),
    "cors_origin": ("answer CORS for this origin, e.g. http://localhost:3000 (repeatable, or "
                    "a comma list; * for any)", "ORIGIN"),
    "allow_open_publish": ("allow publishing without a token on a public address", None),
    "max_body_bytes": ("largest request body", "SIZE"),
    "max_message_bytes": ("largest message data (serialised JSON)", "SIZE"),
    "max_channels": ("most channels per subscribe or per message", "N"),
    "max_limit": ("most messages in one subscribe response", "N"),
    "max_messages_per_channel": ("messages cached per channel (oldest evicted)", "N"),
    "max_cached_bytes": ("bytes of messages cached in all (oldest evicted)", "SIZE"),
    "max_connections": ("open connections before answering 503 overloaded", "N"),
    "max_response_bytes": ("message bytes in one subscribe answer (more: cut, like limit)",
                           "SIZE"),
    "stream_retention_age": ("seconds a Durable Stream keeps each append when its creation "
                             "gives no Stream-Retention-Age (0: all)", "SECONDS"),
    "stream_retention_bytes": ("bytes of appends a Durable Stream keeps when its creation "
                               "gives no Stream-Retention-Bytes (0: all)", "SIZE"),
    "header_timeout": ("seconds a request's line and headers may take to arrive",
                       "SECONDS"),
    "keepalive_timeout": ("seconds an idle keep-alive connection is kept", "SECONDS"),
    "send_timeout": ("seconds a client may leave its answers unread before we hang up",
                     "SECONDS"),
    "peer_queue": ("channel operations queued per peer (oldest dropped past it)", "N"),
    "publish_ack": ("when a publish gets its 201: peer (once a peer holds it, so the crash "
                    "of this node loses nothing acknowledged; on Redis, once a replica of "
                    "its primary holds it, if it has one), all (every peer, or replica, not "
                    "down) or local (at once; on Redis, once the primary holds it)", "WHEN"),
    "publish_ack_timeout": ("seconds a publish waits for a peer or replica before the "
                            "answer is 202: stored, not yet copied", "SECONDS"),
    "idempotency_window": ("seconds a publish's Idempotency-Key is remembered: a retry with "
                           "it within this time stores nothing new", "SECONDS"),
    "log_level": ("debug, info, warn, error or critical", "LEVEL"),
    "log_format": ("text, or json: one JSON object a line for log shippers", "FORMAT"),
    "data_dir": ("keep the cache in SQLite in this directory, so a restart loses nothing "
                 "acknowledged and retained (single node only; on the mesh, the node's "
                 "Durable Streams only; one process at a time)", "DIR"),
    "admin_port": ("serve /stats and /metrics (and /health) on this port, on --admin-host, "
                   "and no longer on the client port (0: on the client port)", "PORT"),
    "admin_host": ("address of --admin-port (keep it private: /stats names the peers)",
                   "HOST"),
    "drain_window": ("at SIGTERM, end the open event streams spread over this many "
                     "seconds, jittered, instead of all at once (held long polls are "
                     "answered at once either way; 0: all at once)", "SECONDS"),
    "presence": ("count each channel's subscribers and members (GET /presence, "
                 "subscribe presence=1); implied by --webhook-url", None),
    "presence_window": ("seconds a subscriber counts after its poll or stream ended "
                        "(0: --max-timeout + 5)", "SECONDS"),
    "presence_members": ("members GET /presence lists per channel at most (the count stays "
                         "exact)", "N"),
    "webhook_url": ("POST presence events to this URL, batched and signed (repeatable)",
                    "URL"),
    "webhook_secret": ("HMAC-SHA256 secret the webhooks are signed with", "S"),
    "webhook_queue": ("webhook events queued per URL while its receiver is slow or down; "
                      "past it the oldest are dropped (counted in /metrics)", "N"),
    "stream_webhook_key": ("Ed25519 private key (PEM) Durable Streams subscription webhooks "
                           "are signed with, published at /v1/stream/__ds/jwks.json; the "
                           "same file on every node (default: one made at start)", "FILE"),
    "stream_webhook_queue": ("stream subscription webhook deliveries waiting for a "
                             "connection; past it a delivery is refused and retried with "
                             "backoff (counted in /metrics)", "N"),
}
_TYPES = {f.name: f.type for f in fields(Config)}
# The settings that are byte sizes: bytes, or a number with a unit (256MiB; sizes.py).
SIZES = tuple(name for name, (_, metavar) in _HELP.items() if metavar == "SIZE")
# Secrets can also be read from a file (no secret in argv, ps or a unit file):
# the file option's name -> the setting it fills, and its help text.
SECRET_FILES = {"cluster_secret_file": "cluster_secret", "publish_token_file": "publish_token",
                "subscribe_secret_file": "subscribe_secret",
                "subscribe_secret_previous_file": "subscribe_secret_previous"}
_FILE_HELP = {
    "cluster_secret_file": ("read the cluster secret from this file (trailing newline ignored)",
                            "FILE"),
    "publish_token_file": ("read the publish token from this file (trailing newline ignored)",
                           "FILE"),
    "subscribe_secret_file": ("read the subscribe secret from this file (trailing newline "
                              "ignored)", "FILE"),
    "subscribe_secret_previous_file": ("read the previous subscribe secret from this file",
                                       "FILE"),
}
_OPTIONS = (*_HELP, *_FILE_HELP)
INTERNAL_ENV_PREFIX = "PUSHUP_WORKER_"  # what a supervisor hands its workers


class CommandParser(argparse.ArgumentParser):
    """argparse, with its errors raised as ConfigError, and a mistyped flag
    named first, with the closest one the command has (argparse says only
    "unrecognized arguments", or first that a required flag is missing)."""

    _given: Sequence[str] = ()

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: Any = None) -> tuple[Any, list[str]]:
        self._given = list(args or ())
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> None:  # type: ignore[override]
        known = sorted({flag for parser in self._parsers() for action in parser._actions
                        for flag in action.option_strings if flag.startswith("--")})
        for word in self._given:
            flag = word.split("=", 1)[0]
            if word == "--":
                break
            # an abbreviation argparse accepts is not a mistake
            if flag.startswith("--") and not any(k.startswith(flag) for k in known):
                close = difflib.get_close_matches(flag, known, n=1)
                raise ConfigError(f"unknown flag {flag}"
                                  + (f"; did you mean {close[0]}?" if close else ""))
        raise ConfigError(message)

    def _parsers(self) -> list[argparse.ArgumentParser]:
        """This parser and its commands' (the top parser reports their flags)."""
        found: list[argparse.ArgumentParser] = [self]
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += action.choices.values()
        return found


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog="pushup", description="PushUp long-polling pub/sub server",
                           epilog="pushup COMMAND --help shows a command's options.")
    parser.add_argument("-V", "--version", action="store_true",
                        help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=CommandParser,
                                     metavar="COMMAND")
    serve = commands.add_parser("serve", help="run a node in the foreground")
    # listed for --help; `pushup token` and `pushup help` are run by the CLI before parsing
    commands.add_parser("token", help="print a subscriber token (HS256 for --subscribe-secret, "
                        "or signed with --key-file for --subscribe-jwks) or a key's JWKS",
                        add_help=False)
    commands.add_parser("help", help="show this help, or a command's (pushup help serve)",
                        add_help=False)
    serve.add_argument("--config", metavar="FILE", help="TOML file of settings")
    defaults = {f.name: f.default for f in fields(Config)}
    for name, (text, metavar) in (_HELP | _FILE_HELP).items():
        flag = "--" + name.replace("_", "-")
        default = defaults.get(name)
        shown = "" if default in ("", (), None, False) or "secret" in name or "token" in name \
            else f"default {default}; "
        if name in SIZES:
            text += " in bytes, or with a unit: 64KiB, 256MiB, 1GB"
        text = f"{text} [{shown}env PUSHUP_{name.upper()}]"
        if _TYPES.get(name) == "bool":
            serve.add_argument(flag, action="store_const", const="true", default=None, help=text)
        elif name in ("peer", "cors_origin", "webhook_url"):
            serve.add_argument(flag, action="append", default=None, metavar=metavar, help=text)
        else:
            serve.add_argument(flag, default=None, metavar=metavar, help=text)
    return parser


def load(
    argv: Sequence[str],
    environ: Mapping[str, str],
    read_file: Callable[[str], bytes] = lambda p: Path(p).read_bytes(),
) -> Config:
    """Parse ``pushup serve ...`` into a Config, or raise ConfigError."""
    args = vars(build_parser().parse_args(list(argv)))
    config_path = args.pop("config") or environ.get("PUSHUP_CONFIG")
    from_file = _read_toml(config_path, read_file) if config_path else {}
    from_env: dict[str, Any] = {}
    for name in _OPTIONS:
        value = environ.get("PUSHUP_" + name.upper())
        if value is not None:
            listed = name in ("peer", "cors_origin", "webhook_url")
            from_env[name] = value.split(",") if listed else value
    from_flags = {name: args[name] for name in _OPTIONS if args.get(name) is not None}
    raw: dict[str, Any] = {}
    for layer, name_of in ((from_file, lambda o: f"config file {config_path}, key {o}"),
                           (from_env, lambda o: "PUSHUP_" + o.upper()),
                           (from_flags, lambda o: "--" + o.replace("_", "-"))):
        # each value is converted where it was given, so an error names that source
        raw.update({name: _convert(name, value, name_of(name)) for name, value
                    in _read_secret_files(layer, name_of, read_file).items()})
    return validate(Config(**raw))


def unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """One warning for each ``PUSHUP_*`` variable that names no setting, with
    the closest setting's variable. A warning, not an error: another program
    on the host (a web app's ``PUSHUP_URL``) may use the prefix too."""
    known = sorted({"PUSHUP_" + o.upper() for o in _OPTIONS} | {"PUSHUP_CONFIG"})
    return [f"unknown environment variable {key} ignored" + _did_you_mean(key, known)
            for key in sorted(environ)
            if key.startswith("PUSHUP_") and key not in known
            and not key.startswith(INTERNAL_ENV_PREFIX)
            and key != "PUSHUP_PURE"]  # not a setting: run the interpreted core (pushup/_build.py)


def _read_secret_files(layer: dict[str, Any], name_of: Callable[[str], str],
                       read_file: Callable[[str], bytes]) -> dict[str, Any]:
    """One source's settings with each ``*_file`` replaced by the secret it holds.

    A secret and its file in the same source are refused (which would win?);
    across sources the usual precedence applies, whichever form each uses.
    ``name_of`` spells an option as that source does, for error messages.
    """
    out = dict(layer)
    for option, setting in SECRET_FILES.items():
        if option not in out:
            continue
        path = out.pop(option)
        if setting in out:
            raise ConfigError(f"{name_of(setting)} and {name_of(option)} are both given; "
                              "use one")
        out[setting] = read_secret(path, name_of(option), read_file)
    return out


def read_secret(path: object, name: str,
                read_file: Callable[[str], bytes] = lambda p: Path(p).read_bytes()) -> str:
    """The secret a file holds (its trailing newline ignored), or ConfigError
    naming ``name`` (the option as the user spelled it)."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{name}: invalid value {path!r}")
    try:
        text = read_file(path).decode("utf-8")
    except OSError as e:
        raise ConfigError(f"{name}: cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: {path} is not UTF-8 text") from None
    secret = text.rstrip("\r\n")
    if not secret.strip():
        raise ConfigError(f"{name}: {path} is empty")
    return secret


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _read_toml(path: str, read_file: Callable[[str], bytes]) -> dict[str, Any]:
    try:
        data = tomllib.loads(read_file(path).decode("utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    unknown = sorted(set(data) - set(_OPTIONS))
    if unknown:
        raise ConfigError(f"config file {path}: unknown setting {unknown[0]!r}"
                          + _did_you_mean(unknown[0], _OPTIONS))
    return data


def _convert(name: str, value: Any, spelled: str) -> Any:
    """``value`` as setting ``name`` holds it, or ConfigError naming ``spelled``
    (the flag, variable or file key the value came from)."""
    kind = _TYPES[name]
    try:
        if kind == "bool":
            return _to_bool(value)
        if name in ("peer", "cors_origin", "webhook_url"):
            items = [value] if isinstance(value, str) else list(value)
            if name == "cors_origin":  # each item may be a comma list
                items = [part for v in items for part in str(v).split(",")]
            return tuple(str(v).strip() for v in items if str(v).strip())
        if name in SIZES:
            try:
                return parse_size(value)
            except ValueError as e:
                raise ConfigError(f"{spelled}: {e}") from None
        if name == "workers" and str(value).strip() == "auto":
            return os.cpu_count() or 1
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind == "float":
            number = float(value)
            if not math.isfinite(number):
                raise ValueError
            return number
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError):
        raise ConfigError(f"{spelled}: invalid value {value!r}") from None


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(value)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def spelled(name: str) -> str:
    """A setting as each source spells it, for a rule between settings: those
    may come from different sources, so the message names all three."""
    flag, variable = "--" + name.replace("_", "-"), "PUSHUP_" + name.upper()
    return f"{name} ({flag}, {variable} or {name} in the config file)"


_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s?#,]+")  # what a browser sends in Origin


def validate(c: Config) -> Config:
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

    need(0 <= c.port <= 65535, "--port must be 0-65535")
    need(0 <= c.admin_port <= 65535, "--admin-port must be 0-65535")
    need(not c.admin_port or c.admin_port != c.port or c.port == 0,
         f"{spelled('admin_port')} must differ from {spelled('port')}")
    if c.node_id:
        try:
            check_node_id(c.node_id)
        except ValueError as e:
            raise ConfigError(f"--node-id: {e}") from None
    need(c.reactor in REACTORS, f"--reactor must be one of {', '.join(REACTORS)}")
    need(c.log_format in ("text", "json"), "--log-format must be text or json")
    need(c.log_level in LOG_LEVELS, f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    need(1 <= c.workers <= 64, "--workers must be 1-64 or auto")
    need(c.publish_ack in PUBLISH_ACKS, "--publish-ack must be peer, all or local")
    for name in ("message_ttl", "channel_ttl", "max_timeout", "header_timeout",
                 "keepalive_timeout", "send_timeout", "publish_ack_timeout",
                 "idempotency_window"):
        need(getattr(c, name) > 0, f"--{name.replace('_', '-')} must be more than 0")
    for name in ("max_body_bytes", "max_message_bytes", "max_channels", "max_limit",
                 "max_messages_per_channel", "max_cached_bytes", "max_connections",
                 "max_response_bytes", "peer_queue"):
        need(getattr(c, name) >= 1, f"--{name.replace('_', '-')} must be at least 1")
    for name in ("stream_retention_age", "stream_retention_bytes"):
        need(getattr(c, name) >= 0, f"--{name.replace('_', '-')} must be 0 (none) or more")
    need(c.max_message_bytes <= c.max_cached_bytes,
         f"{spelled('max_message_bytes')} must not exceed {spelled('max_cached_bytes')}")
    for origin in c.cors_origin:
        need(origin == "*" or bool(_ORIGIN.fullmatch(origin)),
             f"--cors-origin {origin!r} is not an origin (scheme://host[:port], no path) or *")
    need("*" not in c.cors_origin or len(c.cors_origin) == 1,
         "--cors-origin * already allows every origin: give it alone")
    for url in c.peer:
        need(url.startswith(("http://", "https://")), f"--peer {url!r} is not an http URL")
    need(not c.advertise_url or c.advertise_url.startswith(("http://", "https://")),
         f"--advertise-url {c.advertise_url!r} is not an http URL")
    if c.engine != "mesh":
        try:
            parse_seeds(c.engine)
        except ValueError as e:
            raise ConfigError(f"--engine: {e}") from None
        need(not c.peer, f"{spelled('peer')} is for the mesh; nodes on a Redis "
             f"{spelled('engine')} find each other through Redis")
    need(0 <= c.drain_window <= MAX_DRAIN_WINDOW,
         f"--drain-window must be from 0 to {MAX_DRAIN_WINDOW:g} seconds")
    need(c.presence_window >= 0, "--presence-window must be 0 or more")
    need(c.presence_members >= 0, "--presence-members must be 0 or more")
    for url in c.webhook_url:
        need(url.startswith(("http://", "https://")),
             f"--webhook-url {url!r} is not an http URL")
    need(c.webhook_queue >= 50, "--webhook-queue must be at least 50 (one batch)")
    need(not c.webhook_url or bool(c.webhook_secret),
         f"{spelled('webhook_url')} needs {spelled('webhook_secret')}: webhooks are signed")
    need(c.stream_webhook_queue >= 1, "--stream-webhook-queue must be at least 1")
    need(c.redis_maxlen >= 1, "--redis-maxlen must be at least 1")
    need(1 <= c.redis_partitions <= 1024, "--redis-partitions must be from 1 to 1024")
    need(not c.peer or bool(c.cluster_secret),
         f"{spelled('peer')} needs {spelled('cluster_secret')}: peers always authenticate "
         "each other")
    need(not c.data_dir or c.workers == 1,
         f"{spelled('data_dir')} is for a single process: it cannot be combined with "
         f"{spelled('workers')} above 1 (see README, Data directory)")
    need(not c.data_dir or c.engine == "mesh",
         f"{spelled('data_dir')} is for a single node: on a Redis {spelled('engine')}, "
         "Redis keeps the log")
    need(c.subscribe_jwks_refresh > 0, "--subscribe-jwks-refresh must be more than 0")
    need(not c.subscribe_secret_previous or bool(c.subscribe_secret),
         f"{spelled('subscribe_secret_previous')} needs {spelled('subscribe_secret')}: "
         "the previous secret is kept beside the current one")
    for name in ("subscribe_issuer", "subscribe_audience"):
        need(not getattr(c, name) or c.subscribers_need_tokens,
             f"{spelled(name)} needs {spelled('subscribe_secret')} or "
             f"{spelled('subscribe_jwks')}: it checks subscriber tokens")
    need(is_loopback(c.host) or bool(c.publish_token) or c.allow_open_publish,
         f"refusing to listen on {c.host} with publishing open: set "
         f"{spelled('publish_token')} or {spelled('allow_open_publish')}")
    return c
