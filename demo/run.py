"""`make demo`: the chat of demo/chat.py on a 3-node PushUp cluster behind HAProxy.

    python -m demo.run [--port 8000] [--nodes 3]

Prints the URL to open in two browser windows; Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
import threading
from collections.abc import Sequence

from demo.chat import Chat, serve
from deploy.launch import LocalCluster


class Demo:
    """The chat backend, N nodes and HAProxy in PushUp's front-end role."""

    def __init__(self, nodes: int = 3, front_port: int = 0) -> None:
        publish_token = secrets.token_urlsafe(24)
        subscribe_secret = secrets.token_urlsafe(32)
        self.cluster = LocalCluster(nodes, front_port, node_args=[
            f"--publish-token={publish_token}", f"--subscribe-secret={subscribe_secret}"])
        urls = [self.cluster.node_url(i) for i in range(nodes)]
        self.chat = Chat(urls, publish_token, subscribe_secret, secrets.token_bytes(32))
        self.web = serve(self.chat)
        self.cluster.web_backend = f"127.0.0.1:{self.web.server_address[1]}"

    @property
    def url(self) -> str:
        return self.cluster.front_url + "/"

    def start(self) -> Demo:
        self.cluster.start()
        return self

    def stop(self) -> None:
        self.cluster.stop()
        self.web.shutdown()
        self.web.server_close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--port", type=int, default=8000, help="the front (HAProxy) port")
    args = parser.parse_args(argv)
    demo = Demo(args.nodes, args.port)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:  # a Ctrl-C while the demo starts stops what started, with no traceback
        demo.start()
        print(f"chat on {demo.url} (open it in two windows); Ctrl-C stops", flush=True)
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        demo.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
