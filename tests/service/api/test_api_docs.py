"""/docs works offline: the page and every script and style it loads come from this service
(packaged Swagger UI), and the operations render in a real browser with all other hosts blocked."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from tests.support.api_support import make_server

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import sync_playwright

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.mark.slow  # a real server and a browser
def test_docs_page_loads_only_local_assets(tmp_path: Path) -> None:
    fake = "tests.support.api_support:make_fake_executor"
    server = make_server(tmp_path, executor=fake, GDNVAL_DISPATCH="false")
    server.start()
    try:
        html = httpx.get(f"{server.base}/docs").text
        assert "cdn" not in html.lower() and "/docs/assets/swagger-ui-bundle.js" in html
        assert httpx.get(f"{server.base}/docs/assets/swagger-ui-bundle.js").status_code == 200
        assert httpx.get(f"{server.base}/redoc").status_code == 404  # no CDN-only ReDoc page
        if not Path(CHROMIUM).exists():
            pytest.skip("Debian's chromium is not installed")
        local = urlparse(server.base).netloc
        asked: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page()

                def only_local(route) -> None:
                    asked.append(route.request.url)
                    if urlparse(route.request.url).netloc == local:
                        route.continue_()
                    else:
                        route.abort()

                page.route("**/*", only_local)
                page.goto(f"{server.base}/docs")
                page.wait_for_selector(".opblock", timeout=30_000)
                assert page.locator(".opblock").count() >= 15
                assert page.locator(".auth-wrapper .authorize").count() == 1  # the bearer scheme
            finally:
                browser.close()
        assert asked and all(urlparse(u).netloc == local for u in asked if u.startswith("http")), asked
    finally:
        server.stop()
