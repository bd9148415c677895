"""A new user's first walk through `make demo` on its embedded defaults (SQLite, in-memory channel layer), in
real Chromium: log in, follow the links of home, pending, triage, the heatmap and a node page, open a claim's
diagnosis, submit "Will it fit?". Any 5xx, any 4xx reached by a link, a browser console error or a traceback
in the server's log fails it."""

from __future__ import annotations

import re
from collections import Counter
from urllib.parse import urljoin, urlsplit

from tests.browser.conftest import browser, chromium_path, page, screenshot  # noqa: F401  (fixtures)
from tests.demo.process import demo_running
from tests.demo.test_make_demo import free_port, wait_for

STARTS = ("/", "/claims/pending/", "/claims/triage/", "/fleet/heatmap/", "/fleet/")
# Links that leave the pages a user browses (or would end the session); the API and its docs have their
# own suites.
NOT_FOLLOWED = ("/accounts/logout/", "/admin/", "/static/", "/api/", "/oidc/")
PER_SHAPE = 3  # pages of one URL shape visited (every node page looks alike): bounds the walk's time
MAX_PAGES = 150
WHATIF = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: try-me, namespace: ml-train}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        selectors:
        - cel: {expression: "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('150Gi')) >= 0"}
"""


def shape(path: str) -> str:
    """A URL's shape: its path with names and numbers collapsed, and its query's keys."""
    parts = urlsplit(path)
    segments = [re.sub(r"[^/]*\d[^/]*", "N", s) for s in parts.path.split("/")]
    keys = sorted(k.split("=")[0] for k in parts.query.split("&") if k)
    return "/".join(segments) + "?" + "&".join(keys)


def test_a_new_user_walks_every_page_of_make_demo_without_an_error(tmp_path, page):  # noqa: F811
    port = free_port()
    with demo_running(
        tmp_path, ["make", "--no-print-directory", "demo", f"PORT={port}"], "make demo"
    ) as log_path:
        base = f"http://127.0.0.1:{port}"
        found = wait_for(
            lambda: re.search(r"claimscope demo: (\S+)\s+login: (\S+) / (\S+)", log_path.read_text()),
            180,
            "the demo to print its URL and login",
        )
        user, password = found.group(2), found.group(3)
        wait_for(lambda: "Uvicorn running" in log_path.read_text(), 60, "the server")

        page.goto(base + "/")
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", password)
        page.click("button[type=submit]")
        page.wait_for_selector("text=Physical GPUs and devices")

        statuses: dict[str, int] = {}
        shapes: Counter[str] = Counter()
        queue = list(STARTS)
        while queue and len(statuses) < MAX_PAGES:
            path = queue.pop(0)
            if path in statuses or shapes[shape(path)] >= PER_SHAPE:
                continue
            shapes[shape(path)] += 1
            response = page.goto(base + path)
            statuses[path] = response.status if response else 0
            if path == "/fleet/heatmap/":  # drawn from the websocket's snapshot
                page.wait_for_selector("#heatmap-summary:has-text('GPUs on')")
            for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))"):
                url = urljoin(base + path, href)
                if not url.startswith(base + "/"):
                    continue
                target = url[len(base) :].split("#")[0]
                if target and not target.startswith(NOT_FOLLOWED) and target not in statuses:
                    queue.append(target)
        bad = {p: s for p, s in statuses.items() if s >= 400 or s == 0}
        assert not bad, bad
        print(f"walked {len(statuses)} pages of {len(shapes)} shapes")
        assert any(p.startswith("/fleet/c/demo/nodes/") for p in statuses), sorted(statuses)
        assert any(p.endswith("/diagnosis/") for p in statuses), sorted(statuses)[:40]

        # A claim's diagnosis, from the first row of the pending page.
        page.goto(base + "/claims/pending/")
        page.click("#pending-groups a[href$='/diagnosis/'] >> nth=0")
        page.wait_for_url("**/diagnosis/")
        assert page.locator("text=The scheduler says").count() >= 1
        screenshot(page, "walk-diagnosis")

        # "Will it fit?" with a claim that asks for a big GPU.
        page.goto(base + "/claims/pending/#whatif")
        page.fill("textarea[name=spec]", WHATIF)
        page.click(".whatif-form button[type=submit]")
        page.wait_for_selector("#whatif-result, #whatif-error", timeout=30_000)
        assert page.locator("#whatif-error").count() == 0, page.inner_text("#whatif")
        assert page.locator("#whatif-result").count() == 1
        screenshot(page, "walk-whatif")

        assert page.console_errors == []
        text = log_path.read_text()
        assert "Traceback" not in text and " 500 " not in text, text[-3000:]
        assert not re.search(r" ERROR ", text), text[-3000:]
