"""The browser client's own tests (``node --test clients/js/test/``), run by pytest.

They start real ``pushup serve`` processes (this virtualenv's ``pushup``). Node
is required: without it this test fails (``make setup`` installs ``nodejs``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_js_client_node_tests() -> None:
    node = shutil.which("node")
    assert node is not None, "node is not installed: `make setup` installs nodejs"
    pushup = Path(sys.executable).with_name("pushup")
    env = dict(os.environ)
    if pushup.exists():
        env["JS_TEST_PUSHUP_COMMAND"] = str(pushup)
    done = subprocess.run(
        [node, "--test", "clients/js/test/"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, f"node --test failed:\n{done.stdout}\n{done.stderr}"
