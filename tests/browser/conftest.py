"""Headless Chromium for the console tests: Debian's ``chromium`` driven by Playwright.

Playwright's own browser builds are never downloaded: the system browser is launched by path
(``$FLOWSTREAM_TEST_CHROMIUM``, else ``chromium`` on the PATH), headless, in a fresh profile,
with the switches that keep it from calling out (on a closed network its background
connections are refused, and some of them stall a page). Without Playwright or the browser the
tests are skipped, except with ``FLOWSTREAM_REQUIRE_KAFKA=1`` (CI), where they fail: CI installs
both (``.ci/run``).

Screenshots go to ``test-artifacts/console/`` at the repository's root (git-ignored), or to
``$FLOWSTREAM_TEST_ARTIFACTS/console/``; each test prints the paths it saved.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import _unavailable

ROOT = Path(__file__).resolve().parents[2]

#: Keep Chromium quiet on a closed network and in a container (no sandbox as root, no GPU).
CHROMIUM_SWITCHES = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--metrics-recording-only",
]


def chromium_path() -> str | None:
    configured = os.environ.get("FLOWSTREAM_TEST_CHROMIUM")
    if configured:
        return configured if Path(configured).is_file() else None
    return shutil.which("chromium")


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where the console tests keep their screenshots."""
    base = Path(os.environ.get("FLOWSTREAM_TEST_ARTIFACTS", ROOT / "test-artifacts"))
    folder = base / "console"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def playwright_session() -> Iterator[Any]:
    # Module scope, not session: Playwright's sync API runs an event loop on this thread while
    # it is started, and every later asyncio.run() in the session would fail until it stops.
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("no Playwright: pip install -e '.[test]'")
    with sync_playwright() as playwright:
        yield playwright


@pytest.fixture
def browser_page(playwright_session: Any, tmp_path: Path) -> Iterator[Any]:
    """A page of a fresh headless Chromium profile (its own sessionStorage)."""
    executable = chromium_path()
    if executable is None:
        _unavailable("no Chromium: apt-get install chromium (or set FLOWSTREAM_TEST_CHROMIUM)")
    context = playwright_session.chromium.launch_persistent_context(
        str(tmp_path / "chromium-profile"),
        executable_path=executable,
        headless=True,
        args=CHROMIUM_SWITCHES,
        viewport={"width": 1360, "height": 900},
        service_workers="block",
    )
    context.set_default_timeout(20_000)
    page = context.pages[0] if context.pages else context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield page
    finally:
        context.close()
    assert errors == [], f"the console raised in the browser: {errors}"
