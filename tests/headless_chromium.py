"""The installed Chromium, headless, driven through Playwright: for the tests that look at a page as a reader's
browser lays it out (the HTML report)."""

import contextlib
import shutil
from collections.abc import Iterator

import pytest

_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
          "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def chromium() -> Iterator:
    """A launched browser, closed afterwards; the test is skipped where Playwright or Chromium is missing."""
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is a test dependency")
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no headless Chromium here (apt-get install chromium)")
    with playwright.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=browser, args=_FLAGS)
        try:
            yield launched
        finally:
            launched.close()
