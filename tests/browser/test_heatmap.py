"""The live heatmap in real Chromium, served by a real ASGI server (HTTP + websockets) in this process."""

from __future__ import annotations

import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection, connections
from django.utils import timezone

from fleet import feed, heatmap
from fleet.filters import FleetFilter
from fleet.models import WatchCursor
from tests.browser.conftest import screenshot
from tests.fleet_pages.conftest import FIXTURE, FIXTURE_GPUS, PASSWORD, FleetEditor
from tests.fleet_pages.server import asgi_server, free_port

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
LIVE_UPDATE_DEADLINE_MS = 2000  # issue 6: an ingested change shows in the open page within 2 s


@pytest.fixture(autouse=True)
def _short_lived_connections():
    # Server threads must not keep connections open past the test (the test database is dropped after).
    max_age = connections.databases["default"].get("CONN_MAX_AGE")
    connections.databases["default"]["CONN_MAX_AGE"] = 0
    yield
    connections.databases["default"]["CONN_MAX_AGE"] = max_age


@pytest.fixture
def server():
    with asgi_server() as url:
        yield url


@pytest.fixture
def fixture_fleet():
    get_user_model().objects.create_user("alice", password=PASSWORD)
    call_command("import_snapshot", str(FIXTURE), cluster="fixtures", stdout=StringIO())


def log_in(page, server):
    page.goto(server + "/accounts/login/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server + "/")


def open_heatmap(page, server, query=""):
    page.goto(f"{server}/fleet/heatmap/{query}")
    page.wait_for_selector("#live[data-state=live]")
    page.wait_for_selector("#heatmap[data-rendered]")


def cells_drawn(page) -> int:
    """GPU blocks painted on the canvas: counted from its pixels, not from the page's own bookkeeping."""
    return page.evaluate(
        """() => {
          const canvas = document.getElementById('heatmap-canvas');
          const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
          const seen = new Set();
          for (const key of Object.keys(window.heatmapRows())) {
            const row = window.heatmapRows()[key];
            for (const cell of row[4]) {
              const p = window.heatmapCellCenter(key, cell[0]);
              const box = canvas.getBoundingClientRect();
              const ratio = window.devicePixelRatio || 1;
              const x = Math.round((p.x - box.left) * ratio), y = Math.round((p.y - box.top) * ratio);
              const i = (y * canvas.width + x) * 4;
              // An empty slot is #eef1f6 and the background white: a GPU block is neither.
              const rgb = [data[i], data[i + 1], data[i + 2]].join(',');
              if (rgb !== '238,241,246' && rgb !== '255,255,255') seen.add(key + '#' + cell[0]);
            }
          }
          return seen.size;
        }"""
    )


def block_colour(page, key: str, index: int) -> str:
    """The painted colour at the centre of one GPU's block, as "r,g,b"."""
    return page.evaluate(
        """([key, index]) => {
          const canvas = document.getElementById('heatmap-canvas');
          const p = window.heatmapCellCenter(key, index), box = canvas.getBoundingClientRect();
          const ratio = window.devicePixelRatio || 1;
          const d = canvas.getContext('2d').getImageData(
            Math.round((p.x - box.left) * ratio), Math.round((p.y - box.top) * ratio), 1, 1).data;
          return [d[0], d[1], d[2]].join(',');
        }""",
        [key, index],
    )


def in_thread(work):
    """Ingest from another thread, as a watch worker would; its change event goes out after commit."""
    errors = []

    def run():
        try:
            work()
        except Exception as exc:  # re-raised in the test thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if errors:
        raise errors[0]


def test_the_heatmap_has_one_cell_per_gpu_and_shows_an_ingested_change_without_reload(
    server, fixture_fleet, page
):
    log_in(page, server)
    open_heatmap(page, server)
    assert cells_drawn(page) == FIXTURE_GPUS
    assert page.evaluate("window.heatmapStats.cells") == FIXTURE_GPUS
    assert "118 of 336 compute slices allocated" in page.inner_text("#heatmap-summary")
    screenshot(page, "heatmap-fixture")
    page.evaluate("window.notReloaded = true")

    editor = FleetEditor()
    claim = next(
        c
        for c in editor.allocated_claims()
        if all("mig" not in r["device"] for r in c["status"]["allocation"]["devices"]["results"])
    )
    held = claim["status"]["allocation"]["devices"]["results"][0]  # NVIDIA pools are named after nodes
    key, index = f"fixtures/{held['pool']}", int(held["device"].rsplit("-", 1)[1])
    before = block_colour(page, key, index)

    in_thread(lambda: FleetEditor().deallocate(claim))
    page.wait_for_selector("#heatmap[data-rendered='2']", timeout=LIVE_UPDATE_DEADLINE_MS)
    # Only the delta's rows were repainted: the freed GPU's block now has the 0/7 colour.
    assert block_colour(page, key, index) != before
    assert block_colour(page, key, index) == "0,32,76"
    assert cells_drawn(page) == FIXTURE_GPUS
    allocated = heatmap.summary(feed.load_rows(FleetFilter()))["compute_slices_allocated"]
    assert allocated < 118
    assert f"{allocated} of 336 compute slices allocated" in page.inner_text("#heatmap-summary")
    assert page.evaluate("window.notReloaded === true")
    assert page.evaluate("window.heatmapStats.deltas") == 1
    assert page.get_attribute("#live", "data-state") == "live"
    assert page.console_errors == []


def test_filters_hover_and_click_through_to_the_gpu(server, fixture_fleet, page):
    log_in(page, server)
    open_heatmap(page, server)
    page.select_option("select[name=model]", "H100")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/fleet/heatmap/?*model=H100*")
    page.wait_for_selector("#live[data-state=live]")
    page.wait_for_selector("#heatmap[data-rendered]")
    assert cells_drawn(page) == 16  # two H100 nodes of 8 GPUs

    point = page.evaluate("window.heatmapCellCenter('fixtures/h100-m1', 0)")
    page.mouse.move(point["x"], point["y"])
    page.wait_for_selector("#gpu-card .uuid")
    assert page.inner_text("#gpu-card h3") == "h100-m1 · GPU 0"
    assert page.inner_text("#gpu-card .uuid").startswith("GPU-")
    tip = page.inner_text("#heatmap-tip")
    assert "h100-m1 · GPU 0" in tip and "H100" in tip and "compute slices allocated" in tip
    screenshot(page, "heatmap-h100-hover")

    point = page.evaluate("window.heatmapCellCenter('fixtures/h100-d1', 2)")
    page.mouse.click(point["x"], point["y"])
    page.wait_for_url("**/fleet/c/fixtures/nodes/h100-d1/gpus/2/")
    assert "GPU 2 on h100-d1" in page.inner_text("h1")
    assert page.console_errors == []


def test_overview_and_mig_pages_render_with_a_stale_stream_flagged(server, fixture_fleet, page):
    WatchCursor.objects.create(
        cluster_id=FleetEditor().cluster.pk,
        kind="ResourceSlice",
        state="watching",
        last_event_at=timezone.now() - timedelta(minutes=30),
    )
    log_in(page, server)
    page.goto(server + "/fleet/")
    assert "1 stream not healthy" in page.inner_text("#stream-alert")
    screenshot(page, "fleet-overview")
    page.click("nav.tabs >> text=MIG slots")
    page.wait_for_url("**/fleet/mig/*")
    assert page.locator(".mig").count() == 24
    screenshot(page, "fleet-mig")
    assert page.console_errors == []


def test_the_page_shows_stale_when_the_feed_drops_and_reconnects_by_itself(fixture_fleet, page):
    port = free_port()
    with asgi_server(port) as url:
        log_in(page, url)
        open_heatmap(page, url)
    page.wait_for_selector("#live[data-state=stale]")
    assert "reconnecting" in page.inner_text("#live")
    screenshot(page, "heatmap-stale")
    with asgi_server(port):
        page.wait_for_selector("#live[data-state=live]", timeout=30_000)  # backoff: 0.25-0.5 s, then doubling
        assert page.evaluate("window.heatmapStats.snapshots") == 2
        assert cells_drawn(page) == FIXTURE_GPUS
    page.console_errors[:] = [e for e in page.console_errors if "WebSocket connection" not in e]
    assert page.console_errors == []  # apart from the browser's own note on the refused reconnects
