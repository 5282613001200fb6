"""Debian's headless Chromium through Selenium, for the browser tests."""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import pytest


def chrome(*flags: str) -> Any:
    """A headless Chromium session (fails, never skips, when it is missing)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.fail("headless Chromium is needed: `make test` installs chromium and "
                    "chromium-driver (Debian)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    # Without the background-networking flags Chromium tries hosts this closed
    # machine cannot reach.
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", *flags,
                 f"--user-data-dir={tempfile.mkdtemp(prefix='pushup-chromium-')}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(driver))
