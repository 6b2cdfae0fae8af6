"""What every browser test module shares: Debian's Chromium under Playwright, started once per
module after the module's own ``live`` cluster."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser.support import LiveCluster, launch_chromium


@pytest.fixture(scope="module")
def browser(live: LiveCluster) -> Iterator[Any]:
    """Debian's Chromium under Playwright for the module (after its ``live`` cluster)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()
