"""Headless Chromium for the tests of the pages and the demo: Debian's ``chromium`` and
``chromium-driver`` (installed by .ci/run), never a browser a test tool downloads.

- ``needs_chromium``: the mark that skips a test where either is missing.
- ``chromium(tmp_path, window=(width, height))``: a driver with its own profile under ``tmp_path``;
  the caller quits it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

needs_chromium = pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="Debian's chromium and chromium-driver are not installed",
)


def chromium(tmp_path: Path, window: tuple[int, int] = (1280, 1600)) -> Any:
    """A headless Chromium driver (no sandbox, no GPU, nothing fetched in the background)."""
    pytest.importorskip("selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        f"--window-size={window[0]},{window[1]}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
