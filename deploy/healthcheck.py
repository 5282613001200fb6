"""The container image's HEALTHCHECK: exit 0 when the node's ``/health`` answers 200
(it can take a publish), 1 when it answers anything else or nothing (starting,
draining, its engine down: docs/api.md, "/health").

It asks where the node listens as the ``PUSHUP_*`` variables say (the image's way of
configuring a node): ``PUSHUP_ADMIN_PORT`` on ``PUSHUP_ADMIN_HOST`` when set, else
``PUSHUP_PORT`` on ``PUSHUP_HOST``, a wildcard host (0.0.0.0, ::) asked on loopback.
Standard library only; it runs in the image's Python, beside the node.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping

WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def health_url(environ: Mapping[str, str]) -> str:
    admin_port = environ.get("PUSHUP_ADMIN_PORT", "0").strip() or "0"
    if admin_port != "0":
        host, port = environ.get("PUSHUP_ADMIN_HOST", "127.0.0.1"), admin_port
    else:
        host, port = environ.get("PUSHUP_HOST", "127.0.0.1"), environ.get("PUSHUP_PORT", "8080")
    host = WILDCARDS.get(host.strip(), host.strip())
    return f"http://{f'[{host}]' if ':' in host else host}:{port.strip()}/health"


def main() -> int:
    url = health_url(os.environ)
    try:
        with urllib.request.urlopen(url, timeout=3) as answer:
            return 0 if answer.status == 200 else 1
    except (OSError, urllib.error.HTTPError) as e:
        print(f"{url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
