"""Debian's Chromium under Playwright (the browser tests, the screenshots): never Playwright's own browser
download, which cannot be fetched here and is not needed."""

from __future__ import annotations

import shutil

CHROMIUM = shutil.which("chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--autoplay-policy=no-user-gesture-required"]
SKIP_REASON = "Debian's chromium is not installed (apt-get install chromium); the browser tests drive it"
# (Playwright itself is a test/extra dependency: imported by the caller)


def launch(playwright, profile_dir, timeout_ms: int = 10_000, viewport=None):
    """A headless persistent Chromium context with the flags this machine needs."""
    kwargs = {"viewport": viewport} if viewport else {}
    ctx = playwright.chromium.launch_persistent_context(user_data_dir=str(profile_dir), executable_path=CHROMIUM,
                                                       headless=True, args=CHROMIUM_ARGS, **kwargs)
    ctx.set_default_timeout(timeout_ms)
    return ctx
