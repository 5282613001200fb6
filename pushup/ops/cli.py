"""``pushup serve``: parse the configuration, install the reactor first, run.
Also ``pushup token`` (a subscriber token, or its key's JWKS) and ``pushup --version``.

Invalid configuration, or a data directory that cannot be used, is one line
on stderr and exit code 2. The reactor is installed before anything imports
``twisted.internet.reactor``; the first line on stdout is ``listening on
http://HOST:PORT`` once connections are accepted (for a worker of
``--workers``: on its private port; the shared one follows its catch-up).
"""

from __future__ import annotations

import gc
import os
import resource
import signal
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import version
from typing import Any

from pushup import BUILD
from pushup.config import (
    INTERNAL_ENV_PREFIX,
    CommandParser,
    Config,
    ConfigError,
    build_parser,
    load,
    read_secret,
    unknown_environment,
)
from pushup.core.errors import BadChannelName
from pushup.core.model import check_channel_name

MEMORY_CHECK = 1.0  # seconds between looks at how much freed memory malloc keeps
GC_YOUNG = 50_000  # objects allocated (net) before a young collection (tune_gc)
TOKEN_TTL = 3600.0  # seconds a token from `pushup token` lasts unless --ttl says
MIN_SECRET_BYTES = 32  # an HS256 key's length, below which PyJWT warns


def main(argv: Sequence[str] | None = None) -> int:
    # Until serving (then stop_on_signals drains): Ctrl-C or SIGTERM exits at
    # once, quietly (no KeyboardInterrupt traceback from the middle of an import).
    for sig in handled_signals():
        signal.signal(sig, lambda n, _: sys.exit(128 + n))
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--version"], ["-V"]):
        print(f"pushup {version('pushup')}\ncore: {BUILD}")
        return 0
    if args[:1] == ["token"]:
        return token(args[1:], os.environ)
    if args[:1] == ["help"]:
        return show_help(args[1:])
    for warning in unknown_environment(os.environ):
        print(f"pushup: warning: {warning}", file=sys.stderr)
    try:
        config = load(args, os.environ)
    except ConfigError as e:
        print(f"pushup: error: {e}", file=sys.stderr)
        return 2
    from pushup.ops.jwks import jwks_problem

    problem = jwks_problem(config)  # a JWKS file is read now: a bad one stops the start
    if problem:
        print(f"pushup: error: {problem}", file=sys.stderr)
        return 2
    from pushup.ops.webhook_key import webhook_key_problem

    problem = webhook_key_problem(config)  # the same for --stream-webhook-key's PEM
    if problem:
        print(f"pushup: error: {problem}", file=sys.stderr)
        return 2
    short = short_secret(config.subscribe_secret)
    worker = any(key.startswith(INTERNAL_ENV_PREFIX) for key in os.environ)
    if short and not worker:  # a worker's supervisor has said it, once
        print(f"pushup: warning: {short}", file=sys.stderr)
    if config.workers > 1:
        from pushup.ops.workers import supervise

        return supervise(config)
    return serve(config)


def token(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """``pushup token --channels a,room:* [--ttl SECONDS]``: print a subscriber token
    signed HS256 with the subscribe secret (``--secret-file``, or PUSHUP_SUBSCRIBE_SECRET
    or PUSHUP_SUBSCRIBE_SECRET_FILE in the environment), or with ``--key-file``'s
    private key (RS256, ES256 or EdDSA, named by ``--kid``); ``--jwks`` prints
    that key's public JWKS instead, for ``--subscribe-jwks``."""
    import json
    import time

    from pushup.http.tokens import issue
    from pushup.ops.jwks import private_key, public_jwks

    parser = CommandParser(
        prog="pushup token",
        description="Print a subscriber token (a JWT) for the given channels, signed HS256 "
                    "with the subscribe secret (from --secret-file, or from "
                    "PUSHUP_SUBSCRIBE_SECRET_FILE or PUSHUP_SUBSCRIBE_SECRET in the "
                    "environment), or with a private key (--key-file, --kid) for a node "
                    "started with --subscribe-jwks.")
    parser.add_argument("--channels", metavar="NAMES",
                        help="comma-separated channel names, or prefixes ending in *, "
                             "e.g. news,room:* (required but with --jwks)")
    parser.add_argument("--ttl", type=float, default=TOKEN_TTL, metavar="SECONDS",
                        help=f"lifetime of the token in seconds (default {TOKEN_TTL:g})")
    parser.add_argument("--secret-file", metavar="FILE",
                        help="file holding the subscribe secret (HS256)")
    parser.add_argument("--key-file", metavar="PEM",
                        help="sign with this unencrypted PEM private key instead: RS256 for "
                             "an RSA key, ES256 for EC P-256, EdDSA for Ed25519")
    parser.add_argument("--kid", metavar="KID",
                        help="the key's id, in the token's header (needed with --key-file: "
                             "the node picks the key of its --subscribe-jwks by it)")
    parser.add_argument("--issuer", metavar="ISS", help="the iss claim (--subscribe-issuer)")
    parser.add_argument("--audience", metavar="AUD",
                        help="the aud claim (--subscribe-audience)")
    parser.add_argument("--sub", metavar="USER",
                        help="the sub claim: the user --presence counts the subscriber as "
                             "(1 to 200 characters; GET /presence lists members by it)")
    parser.add_argument("--info", metavar="JSON",
                        help="the info claim: a JSON object of at most 1024 bytes, said with "
                             "the user in GET /presence and presence events, e.g. "
                             "'{\"name\":\"Ann\"}'")
    parser.add_argument("--jwks", action="store_true",
                        help="print the public JWKS of --key-file under --kid (a file for "
                             "--subscribe-jwks) instead of a token")
    try:
        opts = parser.parse_args(argv)
    except ConfigError as e:
        print(f"pushup token: error: {e}", file=sys.stderr)
        return 2
    problem = key_problem(opts)
    if problem is None and not opts.jwks:
        problem = channels_problem(opts.channels, opts.ttl)
    info, info_problem = presence_claims(opts.sub, opts.info)
    problem = problem or info_problem
    if problem:
        print(f"pushup token: error: {problem}", file=sys.stderr)
        return 2
    if opts.key_file:
        try:
            key, algorithm = private_key(opts.key_file)
        except ValueError as e:
            print(f"pushup token: error: --key-file: {e}", file=sys.stderr)
            return 2
        if opts.jwks:
            print(json.dumps(public_jwks(key, algorithm, opts.kid), indent=2))
            return 0
        print(issue(key, opts.channels.split(","), time.time() + opts.ttl, algorithm=algorithm,
                    kid=opts.kid, issuer=opts.issuer or "", audience=opts.audience or "",
                    sub=opts.sub or "", info=info))
        return 0
    secret_file = opts.secret_file or environ.get("PUSHUP_SUBSCRIBE_SECRET_FILE")
    try:
        secret = (read_secret(secret_file, "--secret-file") if secret_file
                  else environ.get("PUSHUP_SUBSCRIBE_SECRET", ""))
    except ConfigError as e:
        print(f"pushup: error: {e}", file=sys.stderr)
        return 2
    problem = token_problem(secret, opts.channels, opts.ttl)
    if problem:
        print(f"pushup token: error: {problem}", file=sys.stderr)
        return 2
    short = short_secret(secret)
    if short:
        print(f"pushup token: warning: {short}", file=sys.stderr)
    print(issue(secret, opts.channels.split(","), time.time() + opts.ttl, kid=opts.kid,
                issuer=opts.issuer or "", audience=opts.audience or "", sub=opts.sub or "",
                info=info))
    return 0


def presence_claims(sub: str | None, info: str | None,
                    ) -> tuple[dict[str, Any] | None, str | None]:
    """``--sub`` and ``--info`` checked as a node with ``--presence`` checks
    the claims (pushup.http.presence): the info object, and what is wrong, or None."""
    import json

    from pushup.http.presence import MAX_INFO_BYTES, MAX_USER_CHARS

    if sub is not None and not 0 < len(sub) <= MAX_USER_CHARS:
        return None, f"--sub: a user is 1 to {MAX_USER_CHARS} characters, not {len(sub)}"
    if info is None:
        return None, None
    try:
        value = json.loads(info)
    except ValueError as e:
        return None, f"--info: not JSON ({e}): {info!r:.80}"
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "true or false",
                type(None): "null"}.get(type(value), "a number")
        return None, f"--info: a JSON object ({{...}}), not {kind}: {info!r:.80}"
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                          sort_keys=True).encode())
    if size > MAX_INFO_BYTES:
        return None, f"--info: {size} bytes as JSON; a node takes {MAX_INFO_BYTES} at most"
    return value, None


def key_problem(opts: Any) -> str | None:
    """What is wrong with ``pushup token``'s choice of key, or None."""
    if opts.key_file and opts.secret_file:
        return "--key-file and --secret-file are both given; use one"
    if opts.key_file and not opts.kid:
        return "--key-file needs --kid: the node picks the key of its JWKS by it"
    if opts.jwks and not opts.key_file:
        return "--jwks prints the public keys of --key-file: give it (and --kid)"
    if not opts.jwks and opts.channels is None:
        return "--channels is required"
    return None


def short_secret(secret: str) -> str | None:
    """The one line that says a subscribe secret is shorter than HS256 wants,
    or None. PyJWT's own InsecureKeyLengthWarning (a Python warning with a
    source line, at the first token) is silenced: this line says it once, at
    start, naming the setting."""
    import warnings

    from jwt.warnings import InsecureKeyLengthWarning

    warnings.filterwarnings("ignore", category=InsecureKeyLengthWarning)
    size = len(secret.encode())
    if not 0 < size < MIN_SECRET_BYTES:
        return None
    return (f"the subscribe secret is {size} bytes long; HS256 wants {MIN_SECRET_BYTES} or "
            "more (RFC 7518, section 3.2), or its tokens are easier to forge")


def token_problem(secret: str, channels: str, ttl: float) -> str | None:
    """What is wrong with ``pushup token``'s inputs, naming the input, or None."""
    if not secret:
        return ("no subscribe secret: give --secret-file (or --key-file), or set "
                "PUSHUP_SUBSCRIBE_SECRET_FILE or PUSHUP_SUBSCRIBE_SECRET")
    return channels_problem(channels, ttl)


def channels_problem(channels: str, ttl: float) -> str | None:
    """What is wrong with a token's ``--channels`` or ``--ttl``, or None."""
    for name in channels.split(","):
        if name == "*":
            continue
        try:
            check_channel_name(name[:-1] if name.endswith("*") else name)
        except BadChannelName as e:
            kind = "prefix" if name.endswith("*") else "name"
            return f"--channels: {name!r} is not a valid channel {kind}: {e}"
    if not ttl > 0 or ttl == float("inf"):
        return f"--ttl: a lifetime in seconds above 0, not {ttl:g}"
    return None


def show_help(argv: Sequence[str]) -> int:
    """``pushup help [COMMAND]``: the commands, or one command's options."""
    if argv[:1] == ["token"]:
        return token(["--help"], {})
    if argv and argv[0] != "serve":
        print(f"pushup: error: no command {argv[0]!r}: choose from serve, token, help",
              file=sys.stderr)
        return 2
    try:
        build_parser().parse_args([*argv[:1], "--help"])
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def install_reactor(name: str) -> str | None:
    """Install the reactor ``name``; returns a line for the log when it had to
    install another (an unverified Twisted: pushup/_twisted.py)."""
    if name == "epoll":  # Twisted's, minus a log context per event (pushup/_twisted.py)
        from pushup._twisted import install_lean_epoll

        return install_lean_epoll()
    if name == "poll":
        from twisted.internet import pollreactor as chosen
    else:
        from twisted.internet import selectreactor as chosen  # type: ignore[no-redef]
    chosen.install()  # type: ignore[no-untyped-call]
    return None


def tune_gc() -> None:
    """Once serving: what was built to start (modules, configuration, the node)
    lives until exit, so the collector stops walking it (``gc.freeze``), and
    a young generation of 50,000 objects instead of 700 lets a burst of requests
    finish before a collection (issue 18: −4 µs per delivery; RSS per held poll
    in docs/benchmarks.md). Reference counting frees almost everything a
    request makes; only cycles wait for the collector."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG, 50, 50)


def raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def serve(config: Config) -> int:
    reactor_note = install_reactor(config.reactor)
    raise_open_files_limit()
    from pushup.ops.fleet import BOARD_ENV, join
    from pushup.ops.logs import log_start, start_line, start_logging

    start_logging(config.log_level, config.log_format, worker=bool(os.environ.get(BOARD_ENV)))

    from twisted.internet import reactor
    from twisted.internet.error import CannotListenError
    from twisted.internet.task import LoopingCall

    from pushup._libc import release_free_memory
    from pushup.backplane.disk import DataDirError
    from pushup.ops.node import Node
    from pushup.ops.workers import FD_ENV, REUSE_ENV, SIBLINGS_ENV

    siblings = [url for url in os.environ.get(SIBLINGS_ENV, "").split(",") if url]
    try:
        node = Node(config, reactor, siblings=siblings)
        # A data directory is read back here, before listening: one it cannot
        # read is refused like bad configuration, not found by the first request.
        started = node.start()
    except DataDirError as e:
        print(f"pushup: error: {e}", file=sys.stderr)
        return 2
    # A worker of --workers takes no connection on the shared port until it has
    # caught up (the kernel gives them to its siblings meanwhile); its siblings
    # and the supervisor reach it on its private port at once.
    worker = os.environ.get(REUSE_ENV) == "1"
    try:
        if os.environ.get(FD_ENV):
            node.adopt(int(os.environ[FD_ENV]))
        port = config.port if worker else node.listen()
        if os.environ.get(BOARD_ENV):
            node.fleet = join(os.environ[BOARD_ENV], node.worker_stats, reactor)
    except CannotListenError as e:  # the client port, or --admin-port
        print(f"pushup: error: cannot listen on {e.interface or '0.0.0.0'}:{e.port}: "
              f"{e.socketError}", file=sys.stderr)
        return 1
    if worker:
        started.addCallback(lambda _: node.listen_once(reuse_port=True))
    host = f"[{config.host}]" if ":" in config.host else config.host
    print(f"listening on http://{host}:{port}", flush=True)
    board = os.environ.get(BOARD_ENV, "")  # "FD:INDEX:COUNT" for one of --workers
    parts = board.split(":")
    slot = (int(parts[1]), int(parts[2])) if board else None
    log_start(start_line(config, node.service.store.node_id, f"http://{host}:{port}", slot,
                         engine=node.backplane.engine))
    if reactor_note is not None:
        from twisted.logger import Logger

        Logger(namespace="pushup").warn("reactor: {note}", note=reactor_note)
    tune_gc()
    reactor.addSystemEventTrigger("before", "shutdown", node.stop)
    stop_on_signals(reactor)
    # After a burst of large answers, give the pages malloc keeps back (README).
    trimmer = LoopingCall(release_free_memory)
    trimmer.clock = reactor
    trimmer.start(MEMORY_CHECK, now=False)
    reactor.run(installSignalHandlers=False)  # type: ignore[call-arg]
    # Drained: a late signal (the launcher's SIGTERM after a Ctrl-C) must not
    # kill the exit (Python restores the default handlers while it finalises).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    return 0


def stop_on_signals(reactor: Any) -> None:
    """SIGTERM and SIGINT drain and stop the node, once: a second signal while
    it drains (Ctrl-C in a terminal signals the launcher and every node it
    started, and the launcher then sends SIGTERM) is only noted. Twisted's
    own handlers stop the reactor on each signal and log a ReactorNotRunning
    traceback for the second, so we install these instead."""
    from twisted.logger import Logger

    log = Logger(namespace="pushup")
    stopping: list[str] = []

    def stop(name: str) -> None:
        if stopping:
            log.debug("{signal}: already draining", signal=name)
            return
        stopping.append(name)
        log.info("{signal}: draining, then stopping", signal=name)
        reactor.stop()

    for sig in handled_signals():
        signal.signal(sig, lambda n, _: reactor.callFromThread(stop, signal.Signals(n).name))


def handled_signals() -> list[signal.Signals]:
    """SIGTERM, and SIGINT unless it is ignored (as in a worker of ``--workers``,
    which its supervisor stops with SIGTERM: a terminal's Ctrl-C reaches the
    whole process group, and one signal per worker is enough)."""
    return [sig for sig in (signal.SIGTERM, signal.SIGINT)
            if signal.getsignal(sig) is not signal.SIG_IGN]


if __name__ == "__main__":
    sys.exit(main())
