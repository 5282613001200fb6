"""`make demo`: the chat of demo/chat.py on a 3-node PushUp cluster behind HAProxy.

    python -m demo.run [--port 8000] [--nodes 3] [--logs DIR] [--leave-dead]

Prints the URL to open in two browser windows and each node's URL and PID;
a node that dies is reported and restarted, as in `make cluster`
(deploy/launch.py), or with --leave-dead (`make demo LEAVE_DEAD=1`) left
dead, so the page shows one node fewer up; Ctrl-C stops everything. The
publish token and subscribe secret reach the nodes in their environment,
never on a command line.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from collections.abc import Sequence
from pathlib import Path

from demo.chat import Chat, serve
from deploy.launch import LOGS, LocalCluster, node_lines, prepare_logs, refuse, run


class Demo:
    """The chat backend, N nodes and HAProxy in PushUp's front-end role."""

    def __init__(self, nodes: int = 3, front_port: int = 0, workdir: str | None = None,
                 token_seconds: float = 3600.0) -> None:
        publish_token = secrets.token_urlsafe(24)
        subscribe_secret = secrets.token_urlsafe(32)
        self.cluster = LocalCluster(nodes, front_port, workdir=workdir, node_env={
            "PUSHUP_PUBLISH_TOKEN": publish_token, "PUSHUP_SUBSCRIBE_SECRET": subscribe_secret,
            "PUSHUP_PRESENCE": "1"})  # the page shows who is online
        urls = [self.cluster.node_url(i) for i in range(nodes)]
        self.chat = Chat(urls, publish_token, subscribe_secret, secrets.token_bytes(32),
                         token_seconds=token_seconds)
        self.web = serve(self.chat)
        self.cluster.web_backend = f"127.0.0.1:{self.web.server_address[1]}"

    @property
    def url(self) -> str:
        return self.cluster.front_url + "/"

    def start(self) -> Demo:
        self.cluster.start()
        return self

    def stop_web(self) -> None:
        self.web.shutdown()
        self.web.server_close()

    def stop(self) -> None:
        self.cluster.stop()
        self.stop_web()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--port", type=int, default=8000, help="the front (HAProxy) port")
    parser.add_argument("--logs", default=os.environ.get("PUSHUP_CLUSTER_DIR", str(LOGS)),
                        help="directory of the logs, the last run's removed at start "
                             "(default .cluster/)")
    parser.add_argument("--leave-dead", action="store_true",
                        help="leave a node that dies dead (default: restart it)")
    args = parser.parse_args(argv)
    why = refuse(args.port, f"make demo PORT={args.port + 1}")
    if why is not None:
        print(why, file=sys.stderr)
        return 1
    demo = Demo(args.nodes, args.port, workdir=str(prepare_logs(Path(args.logs))))
    return run(demo.cluster, not args.leave_dead, lambda: [
        f"chat on {demo.url} (open it in two windows)", *node_lines(demo.cluster),
        "kill a node's pid to see the chat go on"
        + (" and the page say 2 of 3 nodes up" if args.leave_dead and args.nodes == 3 else "")
        + "; Ctrl-C stops everything"], stop=demo.stop_web)


if __name__ == "__main__":
    sys.exit(main())
