"""The Debian packages `make test` and `make bench` need, installed only where
their command is missing: never a package whose command the machine already
has, from Debian or from elsewhere.

The rule that made this module: a machine whose image ships Node.js with its
own npm (nodesource's ``nodejs`` bundles it) has no Debian ``npm`` package,
and asking apt for ``npm`` beside that ``nodejs`` is refused outright
(``nodejs : Conflicts: npm``) — the whole install fails for one package the
machine did not need. So each package is named by what it provides: a command
(looked up on PATH) or a file, and asked for only when that is absent.

Stdlib only: it runs before any virtualenv exists.

    python3 deploy/system_packages.py missing test     # print what would be installed
    python3 deploy/system_packages.py install test     # install it (root; apt-get)
    python3 deploy/system_packages.py simulate test    # apt-get install -s of it

No package may start its Debian service during the install (prometheus would
listen on :9090, nginx on :80): without a policy-rc.d already in place, one that
refuses service starts is put there for the install and removed after it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

# What each group needs: (the command or absolute file that shows it is there,
# the Debian package that provides it).
NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    # HAProxy for the cluster, nftables for wire-byte counters and cuts, Node for
    # the browser client's tests, Redis for the Redis engine, Prometheus for the
    # dashboard's test, systemd-analyze for the unit's.
    "test": (
        ("haproxy", "haproxy"),
        ("nft", "nftables"),
        ("node", "nodejs"),
        ("npm", "npm"),
        ("chromium", "chromium"),
        ("chromedriver", "chromium-driver"),
        ("strace", "strace"),
        ("ip", "iproute2"),
        ("tc", "iproute2"),
        ("redis-server", "redis-server"),
        ("openssl", "openssl"),
        ("curl", "curl"),  # --http2 through the TLS fronts (tests/cluster/test_h2_fronts.py)
        ("/usr/bin/prometheus", "prometheus"),
        ("systemd-analyze", "systemd"),
        # podman, with runc (crun refuses this machine's cgroups) and mmdebstrap
        # for the base images, for the container image's test (tests/e2e/test_image.py)
        ("podman", "podman"),
        ("runc", "runc"),
        ("mmdebstrap", "mmdebstrap"),
    ),
    # What `make image` needs: the same three.
    "image": (
        ("podman", "podman"),
        ("runc", "runc"),
        ("mmdebstrap", "mmdebstrap"),
    ),
    # nginx with the nchan module, which `make bench` measures PushUp against.
    "bench": (
        ("nginx", "nginx"),
        ("/usr/lib/nginx/modules/ngx_nchan_module.so", "libnginx-mod-nchan"),
    ),
}
# The places a command counts as present beyond PATH (nginx lives in /usr/sbin,
# which a non-root PATH may lack).
SBIN = ("/usr/sbin", "/sbin")
POLICY = Path("/usr/sbin/policy-rc.d")


def present(what: str, path: str | None = None, sbin: Sequence[str] = SBIN,
            root: str = "/") -> bool:
    """Whether the command ``what`` is on ``path`` (PATH by default) or in ``sbin``,
    or the absolute file ``what`` exists under ``root`` (a test's empty folder
    shows a machine without it)."""
    if what.startswith("/"):
        file = Path(root, what.lstrip("/"))
        return os.access(file, os.X_OK) or file.is_file()
    search = path if path is not None else os.environ.get("PATH", "")
    return shutil.which(what, path=os.pathsep.join([search, *sbin])) is not None


def debian_owns(package: str) -> bool:
    """Whether ``package`` is installed from Debian's archive (not, say, nodesource's)."""
    dpkg = shutil.which("dpkg-query")
    if dpkg is None:
        return False
    r = subprocess.run([dpkg, "-W", "-f", "${Status} ${Version}", package],
                       capture_output=True, text=True)
    return r.returncode == 0 and "install ok installed" in r.stdout and "nodesource" not in r.stdout


def missing(group: str, path: str | None = None,
            has: Callable[[str, str | None], bool] = present,
            owns: Callable[[str], bool] = debian_owns) -> list[str]:
    """The packages of ``group`` whose command or file is absent, each once, in order.

    ``npm`` is never asked for beside a ``node`` that is present: a Node.js that
    is not Debian's brings its own npm, and Debian's npm conflicts with it. Where
    node is present and npm is not, Debian's node is the one that lacks npm.
    ``owns`` says whether Debian's archive installed a package."""
    wanted: list[str] = []
    for what, package in NEEDS[group]:
        if has(what, path) or package in wanted:
            continue
        if package == "npm" and has("node", path) and not owns("nodejs"):
            continue  # a foreign Node.js without npm: Debian's npm would conflict
        wanted.append(package)
    return wanted


def apt_get(args: Sequence[str], quiet: bool = False) -> int:
    """apt-get with ``args``; ``quiet``: dpkg's progress lines (hundreds, on a fresh
    machine) go nowhere, apt's errors still reach stderr."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    out = subprocess.DEVNULL if quiet else None
    return subprocess.run(["apt-get", *args], env=env, stdout=out).returncode


def install(packages: Sequence[str]) -> int:
    if not packages:
        return 0
    added = False
    if not POLICY.exists():
        POLICY.write_text("#!/bin/sh\nexit 101\n")
        POLICY.chmod(0o755)
        added = True
    try:
        rc = apt_get(["update", "-qq"])
        if rc == 0:
            rc = apt_get(["install", "-y", "-qq", *packages], quiet=True)
        return rc
    finally:
        if added:
            POLICY.unlink(missing_ok=True)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("missing", "install", "simulate") \
            or argv[1] not in NEEDS:
        print(f"usage: system_packages.py missing|install|simulate {'|'.join(NEEDS)}",
              file=sys.stderr)
        return 2
    action, group = argv
    packages = missing(group)
    if action == "missing":
        print(" ".join(packages))
        return 0
    if action == "simulate":
        return apt_get(["install", "-s", "-qq", *packages]) if packages else 0
    if packages:
        print(f"system packages: installing {' '.join(packages)}", file=sys.stderr, flush=True)
    return install(packages)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
