"""The interactive API docs load in real Chromium from our own static files, with no external request."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from tests.browser.conftest import ARTIFACTS, browser, chromium_path  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser


def test_api_docs_render_every_endpoint_without_external_requests(browser, live_server, django_user_model):  # noqa: F811
    django_user_model.objects.create_user("alice", password="correct horse battery staple")
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{live_server.url}/accounts/login/?next=/api/docs/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "correct horse battery staple")
    page.click("button[type=submit], input[type=submit]")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        page.wait_for_selector(".swagger-ui .opblock-summary-path", timeout=15_000)
        paths = page.locator(".opblock-summary-path").all_inner_texts()
    finally:
        page.screenshot(path=str(ARTIFACTS / "api_docs.png"), full_page=False)
    context.close()
    assert any("/api/v1/devices/" in p for p in paths) and any("/api/v1/summary/" in p for p in paths)
    origin = urlparse(live_server.url).netloc
    external = [
        u for u in requested if urlparse(u).scheme in ("http", "https") and urlparse(u).netloc != origin
    ]
    assert external == []
    assert errors == []
