"""The heatmap's utilization mode and the idle page in real Chromium, on a live ASGI server."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from fleet.access.visibility import grant_all_namespaces
from simulator import dcgm
from tests.browser.conftest import screenshot
from tests.fleet_pages.server import asgi_server
from usage import ingest
from usage.ingest import Thresholds
from usage.sampler import sample_cluster

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
PASSWORD = "correct horse battery staple"
LIMITS = Thresholds(below=0.05, window=timedelta(minutes=30), interval=timedelta(minutes=1))
B200 = "usage-test/b200-0000"
GAP_GPU = "gpu-7"  # its exporter row is missing from the last round


@pytest.fixture(autouse=True)
def _short_lived_connections():
    max_age = connections.databases["default"].get("CONN_MAX_AGE")
    connections.databases["default"]["CONN_MAX_AGE"] = 0
    yield
    connections.databases["default"]["CONN_MAX_AGE"] = max_age


@pytest.fixture
def sampled(cluster, sim, settings):
    settings.CLAIMSCOPE_IDLE_WINDOW_MINUTES = 30
    user = get_user_model().objects.create_user("alice", password=PASSWORD)
    grant_all_namespaces(user)
    everything = dcgm.InProcessSource(lambda: dcgm.cluster_series(sim.cluster, dcgm.now()))
    start = timezone.now() - timedelta(hours=1)
    for minute in range(0, 31, 10):
        assert sample_cluster(cluster, everything, start + timedelta(minutes=minute), LIMITS).ok
    partial = dcgm.InProcessSource(
        lambda: [
            s
            for s in dcgm.cluster_series(sim.cluster, dcgm.now())
            if not (s.labels["Hostname"] == "b200-0000" and s.labels["gpu"] == "7")
        ]
    )
    assert sample_cluster(cluster, partial, start + timedelta(minutes=40), LIMITS).ok
    return cluster


@pytest.fixture
def server():
    with asgi_server() as url:
        yield url


def log_in(page, server):
    page.goto(server + "/accounts/login/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server + "/")


def pixel(page, key: str, index: int, dx: float, dy: float) -> tuple[int, int, int]:
    """The colour at a point of a GPU's block, offset from its centre by (dx, dy) blocks."""
    return tuple(
        page.evaluate(
            """([key, index, dx, dy]) => {
              const canvas = document.getElementById('heatmap-canvas');
              const p = window.heatmapCellCenter(key, index), q = window.heatmapCellCenter(key, index + 1);
              const step = q.x - p.x, box = canvas.getBoundingClientRect();
              const ratio = window.devicePixelRatio || 1;
              const x = Math.round((p.x + dx * step - box.left) * ratio);
              const y = Math.round((p.y + dy * step - box.top) * ratio);
              const d = canvas.getContext('2d').getImageData(x, y, 1, 1).data;
              return [d[0], d[1], d[2]];
            }""",
            [key, index, dx, dy],
        )
    )


def test_the_heatmap_colours_gpus_by_utilization_marks_idle_ones_and_shows_gaps(sampled, server, page):
    log_in(page, server)
    page.goto(f"{server}/fleet/heatmap/")
    page.wait_for_selector("#heatmap[data-rendered]")
    page.wait_for_selector("#heatmap[data-usage=loaded]")
    allocation_busy = pixel(page, B200, 3, 0, 0)
    allocation_idle = pixel(page, B200, 0, 0, 0)
    assert allocation_busy == allocation_idle  # both fully allocated: one colour by allocation

    page.select_option("#heatmap-mode", "utilization")
    page.wait_for_selector("#heatmap[data-mode=utilization]")
    screenshot(page, "heatmap-utilization")
    busy, idle = pixel(page, B200, 3, -0.3, 0.3), pixel(page, B200, 0, -0.3, 0.3)
    assert sum(busy) > sum(idle) + 200  # cividis: a busy GPU is bright, an idle one dark
    assert pixel(page, B200, 0, 0.4, -0.4) == (230, 159, 0)  # the idle mark, top-right
    assert pixel(page, B200, 3, 0.4, -0.4) != (230, 159, 0)
    assert page.get_attribute("#heatmap-summary", "data-idle") == "3"
    gap = page.evaluate(f"window.heatmapUsage().rows['{B200}']['7'][0]")
    assert gap is None
    assert pixel(page, B200, 7, 0.35, 0.35) == (201, 206, 216)  # hatched grey: a gap, not 0 %
    assert pixel(page, B200, 7, 0.35, 0.35) != pixel(page, B200, 4, 0.35, 0.35)
    assert "mean activity" in page.text_content("#heatmap-summary")
    assert page.evaluate("location.hash") == "#utilization"
    assert not page.console_errors


def test_the_idle_page_lists_the_idle_claim_and_links_its_exports(sampled, server, page):
    log_in(page, server)
    page.click("nav >> text=Idle")
    page.wait_for_selector("#idle-claims")
    rows = page.locator("#idle-claims tbody tr")
    assert rows.count() == 1
    assert "ml-train/notebook-x" in rows.first.text_content()
    assert page.locator("#idle-waste tbody tr").first.text_content().startswith("ml-train")
    page.fill("input[name=below]", "100")
    page.click("form.window-form button[type=submit]")
    page.wait_for_url("**below=100**")
    assert page.locator("#idle-claims tbody tr").count() == 5
    csv_link = page.get_attribute("text=CSV", "href")
    assert csv_link is not None and "format=csv" in csv_link and "below=100" in csv_link
    assert not page.console_errors


def test_the_triage_report_says_which_claims_held_gpus_idle(sampled, server, page):
    log_in(page, server)
    page.goto(f"{server}/claims/triage/?since=3h")
    page.wait_for_selector("#idle-section[data-state=loaded]")
    sentences = page.locator("#idle-sentences li").all_text_contents()
    assert len(sentences) == 1
    assert sentences[0].startswith("3 B200 idle for ")
    assert " h held by ml-train/notebook-x" in sentences[0]
    assert page.locator("#idle-waste-triage tbody tr").first.text_content().startswith("ml-trainB200")
    assert not page.console_errors


def test_the_trends_page_draws_missed_rounds_as_a_gap_and_says_since_when(
    cluster, sim, settings, server, page
):
    settings.CLAIMSCOPE_USAGE_INTERVAL = 60
    user = get_user_model().objects.create_user("alice", password=PASSWORD)
    grant_all_namespaces(user)
    source = dcgm.InProcessSource(lambda: dcgm.cluster_series(sim.cluster, dcgm.now()))
    start = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=30)
    for minute in (0, 1, 2, 10, 11):  # Prometheus did not answer from minute 3 to 9
        assert sample_cluster(cluster, source, start + timedelta(minutes=minute), LIMITS).ok
    ingest.record_failure(cluster, start + timedelta(minutes=12), "http://prometheus: ConnectionError")
    log_in(page, server)
    page.goto(f"{server}/usage/trends/?since=2h")
    page.wait_for_selector("#trends-chart[data-state=plotted]")
    assert page.text_content("#unavailable").startswith("Utilization unavailable since")
    traces = page.evaluate("document.getElementById('trends-chart').data.map(t => [t.name, t.y])")
    allocated = [y for name, y in traces if name.endswith(" allocated")]
    assert allocated and all(len(y) == 6 for y in allocated)
    assert all(y[3] is None and None not in y[:3] + y[4:] for y in allocated)  # the gap, only there
    assert all(y[3] is None for name, y in traces if name.endswith(" active"))
    assert not page.console_errors
