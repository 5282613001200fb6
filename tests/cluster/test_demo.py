"""The paper's demo in real headless Chromium against real nodes behind real
HAProxy: two people chat through a node failure and both pages show every
message once, in order, with its time, their own lines marked, the view
scrolled to the newest, how many nodes are up and which one serves the page;
a send that fails is shown and retried with the same Idempotency-Key; the
subscribe token is renewed before it expires. `make demo` (demo/run.py) prints
each node's URL and PID, and with LEAVE_DEAD=1 leaves a killed node dead, so
"2 of 3 nodes up" stays to be seen. ``DEMO_SCREENSHOT=docs/demo.png`` keeps a
screenshot (that is how the one in the README was made)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from demo.run import Demo
from tests.chromium import chrome
from tests.cluster.test_launcher import Launcher
from tests.toolkit import children

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30  # seconds any one thing the page should do may take


def until(driver, script: str, timeout: float = WAIT, *args):
    """Until the page's ``script`` (a JS expression body, `return ...`) is truthy."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        lambda d: d.execute_script(script, *args))


def sign_in(driver, url: str, name: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url)
    driver.find_element(By.ID, "name").send_keys(name)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    until(driver, "return window.ready === true")


def say(driver, text: str) -> None:
    """Type a line and press Send, as a person does."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.find_element(By.ID, "text").send_keys(text, Keys.ENTER)


def wait_shown(drivers, expected: list[str]) -> None:
    for driver in drivers:
        until(driver, "return window.shown.length >= arguments[0]", WAIT, len(expected))
        assert driver.execute_script("return window.shown") == expected


def lines(driver) -> list[dict]:
    """What each line of the log shows: its time, who, the text, and whether it is
    marked as the reader's own."""
    return driver.execute_script("""
        return [...document.querySelectorAll('#log li:not(.note)')].map(li => ({
          time: li.querySelector('time').textContent, user: li.querySelector('b').textContent,
          mine: li.classList.contains('mine'), cls: li.className,
          text: li.lastChild.textContent}));""")


def cluster_line(driver) -> str:
    return driver.execute_script("return document.getElementById('cluster').textContent")


def test_two_people_chat_through_a_node_failure():
    demo = Demo(nodes=3).start()
    ann, bob = chrome("--window-size=900,760"), chrome("--window-size=900,760")
    try:
        sign_in(ann, demo.url, "ann")
        sign_in(bob, demo.url, "bob")
        for driver in (ann, bob):  # how many nodes
            until(driver, "return document.getElementById('cluster').textContent"
                          ".startsWith('3 of 3 nodes up: node1 node2 node3')")
        for driver in (ann, bob):  # who is online (presence): both, on both pages
            until(driver, "return document.getElementById('online').textContent"
                          " === '2 online: ann, bob'")
        expected: list[str] = []
        for i in range(3):
            for driver, name in ((ann, "ann"), (bob, "bob")):
                text = f"hello {i} from {name}"
                say(driver, text)
                expected.append(f"{name}: {text}")
                wait_shown([ann, bob], expected)  # one at a time: the order is the chat's
        for driver in (ann, bob):  # which node answered the page's last poll
            assert re.fullmatch(r"3 of 3 nodes up: node1 node2 node3 · your last poll was "
                                r"answered by node[123]", cluster_line(driver).strip())
        demo.cluster.kill(0)  # SIGKILL node1: pages polling through it reconnect
        for driver in (ann, bob):
            until(driver, "return document.getElementById('cluster').textContent"
                          ".startsWith('2 of 3 nodes up')")
        for i in range(3, 6):
            for driver, name in ((ann, "ann"), (bob, "bob")):
                text = f"hello {i} from {name}"
                say(driver, text)
                expected.append(f"{name}: {text}")
                wait_shown([ann, bob], expected)
        for i in range(6):  # more than the log's height: it scrolls
            say(ann, f"and {i}")
            expected.append(f"ann: and {i}")
            wait_shown([ann, bob], expected)
        for driver, me in ((ann, "ann"), (bob, "bob")):
            shown = lines(driver)
            assert [f"{line['user']}: {line['text']}" for line in shown] == expected
            assert all(re.fullmatch(r"\d\d:\d\d:\d\d", line["time"]) for line in shown), shown
            assert [line["mine"] for line in shown] == [line["user"] == me for line in shown]
            assert not [line for line in shown if "pending" in line["cls"]]
            scroll = driver.execute_script(
                "const l = document.getElementById('log');"
                " return [l.scrollHeight, l.clientHeight, l.scrollTop];")
            height, view, top = scroll
            assert height > view, scroll  # the log overflows...
            assert top + view >= height - 2, scroll  # ...and shows its newest line
        for driver in (ann, bob):  # both still online, through the live nodes
            until(driver, "return window.online.join() === 'ann,bob'")
        for driver in (ann, bob):  # answered by a live node since the kill
            assert re.fullmatch(r"2 of 3 nodes up: node1 node2 node3 · your last poll was "
                                r"answered by node[23]", cluster_line(driver).strip())
        shot = os.environ.get("DEMO_SCREENSHOT")
        if shot:
            ann.save_screenshot(str(ROOT / shot))
    finally:
        ann.quit()
        bob.quit()
        demo.stop()


def test_a_failed_send_is_shown_and_retried_with_the_same_key():
    demo = Demo(nodes=2).start()
    ann = chrome("--window-size=900,700")
    try:
        secrets = (demo.chat.publish_token, demo.chat.subscribe_secret, demo.cluster.secret)
        for node in demo.cluster.nodes:  # the secrets are in no command line (`ps`)
            assert node is not None
            cmdline = Path(f"/proc/{node.pid}/cmdline").read_bytes().decode()
            assert not [s for s in secrets if s in cmdline], cmdline
        sign_in(ann, demo.url, "ann")
        say(ann, "first")
        wait_shown([ann], ["ann: first"])
        for i in range(2):
            demo.cluster.kill(i)  # no node: the demo server cannot publish
        say(ann, "are you there?")
        until(ann, "return [...document.querySelectorAll('#log li.failed')]"
                   ".some(li => li.textContent.includes('not sent (503), retrying in'))")
        tries = [a for a in demo.chat.attempts if a[1] == "are you there?"]
        assert tries and not any(sent for _, _, sent in tries)
        until(ann, "return (window.failedSends || 0) >= 2")  # retried by itself
        for i in range(2):
            demo.cluster.start_node(i)
        until(ann, "return window.shown.includes('ann: are you there?')", 60)
        until(ann, "return !document.querySelector('#log li.failed, #log li.pending')")
        assert ann.execute_script("return window.shown").count("ann: are you there?") == 1
        tries = [a for a in demo.chat.attempts if a[1] == "are you there?"]
        assert len(tries) >= 3 and tries[-1][2] is True  # failed, failed, ..., sent
        assert len({key for key, _, _ in tries}) == 1  # every try: one Idempotency-Key
    finally:
        ann.quit()
        demo.stop()


def test_the_subscribe_token_is_renewed_before_it_expires():
    demo = Demo(nodes=2, token_seconds=3).start()
    ann = chrome("--window-size=900,700")
    try:
        sign_in(ann, demo.url, "ann")
        until(ann, "return window.renewals.length >= 2", 20)
        renewals = ann.execute_script("return window.renewals")
        assert all(r["at"] < r["previousExpiry"] for r in renewals), renewals
        say(ann, "still here")  # past the first token's expiry: still delivered
        wait_shown([ann], ["ann: still here"])
        # the renewed tokens' subscriptions go on with who is online
        assert ann.execute_script("return window.online") == ["ann"]
        # the front sends GET /presence to PushUp (not to the chat's backend):
        # it wants a subscribe token, as a subscribe does
        try:
            urllib.request.urlopen(demo.url + "presence?channels=chat:lobby", timeout=10)
        except urllib.error.HTTPError as e:
            assert e.code == 401 and json.loads(e.read())["error"]["code"] == "unauthorized"
        else:
            raise AssertionError("GET /presence without a token was not refused")
    finally:
        ann.quit()
        demo.stop()


class DemoProcess(Launcher):
    """``python -m demo.run`` as `make demo` runs it, its stdout read line by line."""

    COMMAND = ("-m", "demo.run")


def test_make_demo_passes_leave_dead():
    make = shutil.which("make")
    assert make, "make is needed"
    argv = subprocess.run([make, "--no-print-directory", "--dry-run", "demo", "LEAVE_DEAD=1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=30, check=True).stdout
    assert argv.splitlines()[-1].endswith(" -m demo.run --nodes 3 --port 8000 --leave-dead")


def test_the_demo_prints_each_node_and_leaves_a_killed_one_dead(tmp_path):
    demo = DemoProcess(tmp_path, "--leave-dead")
    try:
        demo.wait_line(r"^chat on http://127\.0\.0\.1:\d+/ ")
        pids = {}
        for n in (1, 2, 3):
            m = demo.wait_line(rf"^node{n}: (http://127\.0\.0\.1:\d+) \(pid (\d+)\)$")
            pids[f"node{n}"] = int(m.group(2))
        demo.wait_line(r"^kill a node's pid to see the chat go on and the page say "
                       r"2 of 3 nodes up; Ctrl-C stops everything$")
        assert set(pids.values()) <= set(children(demo.proc.pid))
        os.kill(pids["node1"], signal.SIGKILL)
        demo.wait_line(rf"node1 \(pid {pids['node1']}, .*\) was killed by SIGKILL; left dead "
                       r".*2 of 3 nodes serve")
        # what the page shows, from the demo server's /cluster through the front
        with urllib.request.urlopen(f"{demo.front}/cluster", timeout=15) as r:
            nodes = json.loads(r.read())["nodes"]
        assert [(n["id"], n["up"]) for n in nodes] == [
            ("node1", False), ("node2", True), ("node3", True)]
        demo.proc.send_signal(signal.SIGINT)
        assert demo.proc.wait(timeout=60) == 0
    finally:
        demo.stop()
