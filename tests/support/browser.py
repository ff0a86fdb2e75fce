"""Debian's chromium driven by Playwright, for the tests that look at a page as a reader does."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import ROOT

ARTIFACTS = ROOT / "test-artifacts" / "web"  # git-ignored: screenshots for a person to look at
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ("--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run")


@contextmanager
def chromium_page(width: int, height: int = 900) -> Iterator[Any]:
    """A page of a fresh chromium at this viewport; skips where chromium or Playwright is missing,
    and fails the test on a script error or a server error the page met."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed")
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=list(ARGS))
        try:
            page = browser.new_context(viewport={"width": width, "height": height}).new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("response", lambda r: errors.append(f"{r.status} {r.url}") if r.status >= 500 else None)
            yield page
        finally:
            browser.close()
    assert not errors, f"browser errors: {errors}"


def clipped_tables(page: Any) -> list[str]:
    """The tables wider than the box they sit in (a column cut off, to be scrolled to), each as
    its first header cells."""
    return page.evaluate("""() => [...document.querySelectorAll('.table-wrap')]
        .filter(w => w.scrollWidth > w.clientWidth + 1)
        .map(w => [...w.querySelectorAll('th')].slice(0, 4).map(th => th.textContent).join(' | '))""")


def shot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
