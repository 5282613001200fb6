"""`make image`: the container image of a node, ``localhost/pushup:latest``, built by
podman from deploy/Containerfile, and the base images it starts from where no image
registry can be reached, made from Debian's packages (``mmdebstrap`` → ``podman import``).

The Containerfile builds from two bases: one to compile in (Python with its headers
and a C compiler: mypyc compiles the core, as ``make build`` does) and a small one to
run in (Python alone). Its defaults are the public ``python:3.11-bookworm`` and
``python:3.11-slim-bookworm``; where those cannot be pulled, this makes Debian 12
equivalents (``localhost/pushup-build:bookworm``, ``localhost/pushup-base:bookworm``),
and ``localhost/pushup-tools:bookworm`` (Debian's redis-server and HAProxy) for the
compose cluster. A base image is made once: podman's image store keeps it, and it
is made again only when it is gone (``podman rmi``) or its package list changed.

The Python packages go into the build as wheels the host downloads with its own pip
(``build/image/wheels``, again only when pyproject.toml's requirements change), so
the build itself reaches no network. The build stage of the last build is kept as
``localhost/pushup-build-cache:latest``, so that the next build compiles only when a
source changed; the images it replaces (the previous image, earlier build stages:
600 MB each) are removed by id or by the build stage's own label, never anyone
else's. Standard library only.

    python3 deploy/image.py build      # bases where missing, wheels, the image
    python3 deploy/image.py bases      # only the base images
    python3 deploy/image.py haproxy-cfg  # deploy/compose-haproxy.cfg from the template
    BASE=docker.io/library/python:3.11-slim-bookworm \\
    BUILD_BASE=docker.io/library/python:3.11-bookworm python3 deploy/image.py build
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTAINERFILE = ROOT / "deploy" / "Containerfile"
CONTAINERS_CONF = ROOT / "deploy" / "containers.conf"
WORK = ROOT / "build" / "image"
WHEELS = WORK / "wheels"
TAG = "localhost/pushup:latest"
BUILD_CACHE = "localhost/pushup-build-cache:latest"  # the last build stage, kept as a cache
STAGE_LABEL = "io.pushup.stage=build"  # deploy/Containerfile's build stage says it
SUITE = "bookworm"
IMAGE_PYTHON = (3, 11)  # Debian 12's, and the public bases'
# name -> the Debian packages beyond the essential ones. The runtime base holds
# Python alone; the build base what mypyc needs to compile the core; the tools
# stand in for the public redis and haproxy images in deploy/compose.yml.
BASES: dict[str, tuple[str, ...]] = {
    "localhost/pushup-base:bookworm": ("python3",),
    "localhost/pushup-build:bookworm": ("python3", "python3-dev", "python3-venv", "gcc",
                                        "libc6-dev"),
    "localhost/pushup-tools:bookworm": ("redis-server", "haproxy"),
}
RUN_BASE, BUILD_BASE, TOOLS = BASES
# A Debian 12 that boots systemd, with Debian's Python: tests/ops/test_systemd_unit.py
# runs deploy/pushup.service under a real systemd in it (none runs this machine),
# with the node's environment taken from the image. The tests make it with the
# others (build(also=TEST_BASES)), so that a fresh machine waits once.
SYSTEMD_BASE = "localhost/pushup-systemd:bookworm"
SYSTEMD_PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3")
TEST_BASES = {SYSTEMD_BASE: SYSTEMD_PACKAGES}
# Documentation, manual pages and translations are left out of every base.
SLIM = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*")
LABEL = "io.pushup.base.packages"


def podman_env(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment podman runs in: deploy/containers.conf (runc, no default
    ulimits, the host's network), unless the caller names a containers.conf."""
    return {**environ, "CONTAINERS_CONF": environ.get("CONTAINERS_CONF",
                                                      str(CONTAINERS_CONF))}


class ImageError(Exception):
    """A podman command failed; the message ends with what it said."""


def podman(*args: str, check: bool = True, capture: bool = False,
           timeout: float = 900) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], env=podman_env(), text=True,
                          capture_output=capture, timeout=timeout)
    if check and done.returncode != 0:
        said = (done.stderr or "")[-3000:] if capture else "(its output is above)"
        raise ImageError(f"podman {' '.join(args[:2])} failed (exit {done.returncode}):\n{said}")
    return done


def packages_of(image: str) -> str | None:
    """The package list a base image was made from (its label), or None when there is
    no such image."""
    found = podman("image", "inspect", "--format", f'{{{{index .Labels "{LABEL}"}}}}', image,
                   check=False, capture=True)
    return found.stdout.strip() if found.returncode == 0 else None


def make_base(image: str, packages: Sequence[str]) -> None:
    """Debian 12's essential packages and ``packages``, as a podman image."""
    print(f"pushup image: making the base image {image} from Debian's packages "
          f"({', '.join(packages)}; once, a few minutes)...", file=sys.stderr, flush=True)
    WORK.mkdir(parents=True, exist_ok=True)
    tarball = WORK / (image.rsplit("/", 1)[1].replace(":", "-") + ".tar")
    subprocess.run(["mmdebstrap", "--quiet", "--variant=essential",
                    "--include=" + ",".join(packages),
                    *(f"--dpkgopt=path-exclude={path}" for path in SLIM),
                    SUITE, str(tarball)], check=True, timeout=1800)
    try:
        podman("import", "--quiet", "--change", f"LABEL {LABEL}={','.join(packages)}",
               "--change", 'CMD ["/bin/sh"]', str(tarball), image, capture=True)
    finally:
        tarball.unlink(missing_ok=True)


def bases(also: Mapping[str, Sequence[str]] | None = None) -> None:
    """Each local base image (and each of ``also``) that is missing, or was made from
    other packages, made side by side (each mmdebstrap waits mostly on downloads and
    dpkg: three at once took 3 minutes here, about what one takes)."""
    wanted = {**BASES, **(also or {})}
    missing = [(image, packages) for image, packages in wanted.items()
               if packages_of(image) != ",".join(packages)]
    with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
        for made in [pool.submit(make_base, image, packages) for image, packages in missing]:
            made.result()  # a failure is raised here, once all have ended




def systemd_base() -> str:
    """SYSTEMD_BASE, made first when it is missing (once)."""
    if packages_of(SYSTEMD_BASE) != ",".join(SYSTEMD_PACKAGES):
        make_base(SYSTEMD_BASE, SYSTEMD_PACKAGES)
    return SYSTEMD_BASE


def requirements() -> tuple[list[str], list[str]]:
    """(what building the wheel needs, what running it needs), from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return list(project["build-system"]["requires"]), list(project["project"]["dependencies"])


def wheels() -> None:
    """The wheels of every requirement in build/image/wheels, with the build's
    requirements in build-requires.txt; downloaded again only when they change."""
    if sys.version_info[:2] != IMAGE_PYTHON:
        raise ImageError(f"the wheels are downloaded for this Python ({sys.version.split()[0]}), "
                         f"and the image runs Python {'.'.join(map(str, IMAGE_PYTHON))}: run "
                         "this with a Python of that version (make image PYTHON=python3.11)")
    build, run = requirements()
    wanted = json.dumps([build, run])
    stamp = WORK / "wheels.stamp"
    if stamp.exists() and stamp.read_text() == wanted and WHEELS.is_dir():
        return
    print("pushup image: downloading the wheels of the Python packages (when "
          "pyproject.toml's requirements change)...", file=sys.stderr, flush=True)
    WHEELS.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                    "--only-binary=:all:", "--dest", str(WHEELS), "pip>=23", *build, *run],
                   check=True, timeout=900)
    (WHEELS / "build-requires.txt").write_text("\n".join(build) + "\n")
    stamp.write_text(wanted)


def build_args(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The Containerfile's bases: BASE and BUILD_BASE from the environment (public
    images), else the local ones this makes."""
    return {"BASE": environ.get("BASE", RUN_BASE),
            "BUILD_BASE": environ.get("BUILD_BASE", BUILD_BASE)}


def build(tag: str = TAG, quiet: bool = False,
          also: Mapping[str, Sequence[str]] | None = None) -> str:
    """``tag``, built (the bases and wheels first where needed); ``also``: more base
    images to make beside the local bases when they are missing (the tests'
    SYSTEMD_BASE)."""
    args = build_args()
    if args == {"BASE": RUN_BASE, "BUILD_BASE": BUILD_BASE}:
        bases(also)
    wheels()
    print(f"pushup image: building {tag} (mypyc compiles the core when a source "
          "changed: 1 to 3 minutes)...", file=sys.stderr, flush=True)
    before = image_id(tag)
    common = [*(["--quiet"] if quiet else []), "--network", "host", "--format", "docker",
              "-f", str(CONTAINERFILE), "--build-context", f"wheels={WHEELS}",
              *(f"--build-arg={k}={v}" for k, v in args.items())]
    # The build stage first, under a tag: the layers the next build starts from
    # (then the whole image, from those layers at once).
    podman("build", *common, "--target", "build", "-t", BUILD_CACHE, str(ROOT), capture=quiet)
    podman("build", *common, "-t", tag, str(ROOT), capture=quiet)
    if before and before != image_id(tag):
        # the image it replaces, by its id (not if a container still uses it)
        podman("rmi", before, check=False, capture=True)
    # Earlier builds' stages (600 MB each), now untagged: only images of that label.
    podman("image", "prune", "--force", "--filter", f"label={STAGE_LABEL}", capture=True)
    return tag


def image_id(tag: str) -> str | None:
    found = podman("image", "inspect", "--format", "{{.Id}}", tag, check=False, capture=True)
    return found.stdout.strip() if found.returncode == 0 else None


# The compose cluster's HAProxy configuration: haproxy.cfg.template, as
# deploy/launch.py fills it, with the addresses left to HAProxy's environment
# variables (expanded in double quotes), which deploy/compose.yml sets.
COMPOSE_HAPROXY = ROOT / "deploy" / "compose-haproxy.cfg"
COMPOSE_NODES = 3


def compose_haproxy_config() -> str:
    template = (ROOT / "deploy" / "haproxy.cfg.template").read_text()
    head, _, body = template.partition("\nglobal\n")
    servers = "\n".join(f'    server node{i} "127.0.0.1:${{PUSHUP_NODE{i}_PORT}}" check'
                         for i in range(1, COMPOSE_NODES + 1))
    header = ("# HAProxy in front of deploy/compose.yml's nodes: generated from\n"
              "# haproxy.cfg.template by `python3 deploy/image.py haproxy-cfg`\n"
              "# (tests/e2e/test_image.py checks that it is). Its addresses are\n"
              "# HAProxy's environment variables, which the compose file sets.\n")
    return header + "global\n" + body.format(
        front='"${PUSHUP_FRONT_HOST}:${PUSHUP_FRONT_PORT}"', servers=servers,
        web_backend="", default_backend="pushup", errors="/etc/pushup/errors",
        bind_tls="").rstrip() + "\n"


def main(argv: Sequence[str]) -> int:
    if argv == ["bases"]:
        bases()
        return 0
    if argv == ["haproxy-cfg"]:
        COMPOSE_HAPROXY.write_text(compose_haproxy_config())
        return 0
    if argv in (["build"], []):
        build()
        return 0
    print("usage: image.py [build|bases|haproxy-cfg]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
