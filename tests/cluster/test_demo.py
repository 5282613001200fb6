"""The paper's demo in real headless Chromium: two people chat through a 3-node
cluster behind HAProxy, a node is killed, and both pages still show every
message once, in order. ``DEMO_SCREENSHOT=docs/demo.png`` keeps a screenshot
(that is how the one in the docs was made)."""

from __future__ import annotations

import os
from pathlib import Path

from demo.run import Demo
from tests.chromium import chrome

ROOT = Path(__file__).resolve().parents[2]


def sign_in(driver, url: str, name: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    driver.find_element(By.ID, "name").send_keys(name)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    WebDriverWait(driver, 20).until(lambda d: d.execute_script("return window.ready === true"))


def say(driver, text: str) -> None:
    status = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        " window.send(arguments[0]).then(r => done(r.status));", text)
    assert status == 204, status


def wait_shown(drivers, expected: list[str]) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    for driver in drivers:
        WebDriverWait(driver, 30).until(
            lambda d: len(d.execute_script("return window.shown")) >= len(expected))
        assert driver.execute_script("return window.shown") == expected


def test_two_people_chat_through_a_node_failure():
    demo = Demo(nodes=3).start()
    ann, bob = chrome("--window-size=900,700"), chrome("--window-size=900,700")
    try:
        sign_in(ann, demo.url, "ann")
        sign_in(bob, demo.url, "bob")
        expected: list[str] = []
        for i in range(3):
            for driver, name in ((ann, "ann"), (bob, "bob")):
                text = f"hello {i} from {name}"
                say(driver, text)
                expected.append(f"{name}: {text}")
                wait_shown([ann, bob], expected)  # one at a time: the order is the chat's
        demo.cluster.kill(0)  # SIGKILL node1: pages polling through it reconnect
        for i in range(3, 6):
            for driver, name in ((ann, "ann"), (bob, "bob")):
                text = f"hello {i} from {name}"
                say(driver, text)
                expected.append(f"{name}: {text}")
                wait_shown([ann, bob], expected)
        shot = os.environ.get("DEMO_SCREENSHOT")
        if shot:
            ann.save_screenshot(str(ROOT / shot))
    finally:
        ann.quit()
        bob.quit()
        demo.stop()
