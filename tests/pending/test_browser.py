"""The pending page in real Chromium on the diagnosed monday weekend, served by a real ASGI server."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection, connections

from claims.tasks import recompute_diagnoses
from fleet import ingest
from fleet.models import Cluster, ResourceClaim
from fleet.normalize import normalize
from tests.browser.conftest import ARTIFACTS, screenshot
from tests.fleet_pages.server import asgi_server
from tests.pending.conftest import CLUSTER, PASSWORD, load_monday
from tests.pending.scenario import BIG_WANT, expected_monday

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
LIVE_DEADLINE_MS = 10_000  # recompute + notify + refetch on a shared 2-core machine

CLAIM_YAML = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: big-job
  namespace: ml-train
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
        count: 2
        selectors:
        - cel:
            expression: device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('150Gi')) >= 0
"""


@pytest.fixture(autouse=True)
def _short_lived_connections():
    # Server threads must not keep connections open past the test (the test database is dropped after).
    max_age = connections.databases["default"].get("CONN_MAX_AGE")
    connections.databases["default"]["CONN_MAX_AGE"] = 0
    yield
    connections.databases["default"]["CONN_MAX_AGE"] = max_age


@pytest.fixture
def diagnosed(monkeypatch, admin_user):
    load_monday(monkeypatch)
    return CLUSTER


@pytest.fixture
def server(diagnosed):
    with asgi_server() as url:
        yield url


def log_in(page, server):
    page.goto(server + "/accounts/login/")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server + "/")


def open_pending(page, server, query=""):
    page.goto(f"{server}/claims/pending/{query}")
    page.wait_for_selector("#live[data-state=live]")


def sections(page) -> list[tuple[str, int]]:
    return page.eval_on_selector_all(
        "section.cause",
        "els => els.map(e => [e.querySelector('.cat').textContent, Number(e.dataset.count)])",
    )


def in_thread(work):
    """Run ``work`` in another thread (as a worker would), re-raising its error here."""
    errors = []

    def run():
        try:
            work()
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    if errors:
        raise errors[0]


def test_the_page_shows_the_causes_the_scenario_constructed_with_their_counts(server, page):
    expected = expected_monday()
    log_in(page, server)
    open_pending(page, server)
    shown = [(c, n) for c, n in sections(page)]
    assert Counter(shown) == Counter(expected.groups)
    counts = [n for _, n in shown]
    assert counts == sorted(counts, reverse=True)  # largest cause first
    text = page.inner_text("#pending-groups")
    assert (
        f"{expected.big_pending} want {BIG_WANT}: only B200, B300 match, all {expected.big_devices} held"
        in text
    )
    assert (
        f"{expected.one_g_pending} want H100 1g.10gb: none free, {expected.idle_three_g} 3g.40gb slices idle"
        in text
    )
    assert page.locator("tr.row").count() == sum(n for _, n in expected.groups)
    title = page.get_attribute("tr.row time", "title")
    assert title.startswith("since 2026-03-")
    screenshot(page, "pending-monday")

    page.select_option("select[name=namespace]", "research")
    page.click("#pending-filters button[type=submit]")
    page.wait_for_url("**/claims/pending/?*namespace=research*")
    page.wait_for_selector("#live[data-state=live]")
    assert page.locator("tr.row").count() == expected.namespaces["research"]

    page.click("tr.row a")  # the oldest research claim's diagnosis
    page.wait_for_url("**/diagnosis/")
    assert "The scheduler says" in page.inner_text("#scheduler")
    assert page.locator("table.device-groups").count() >= 1
    screenshot(page, "pending-diagnosis-research")
    assert page.console_errors == []


def test_the_diagnosis_page_of_a_big_memory_claim(server, page):
    claim = ResourceClaim.objects.filter(namespace="ml-train", name__startswith="finetune-").order_by(
        "created_at"
    )[0]
    log_in(page, server)
    page.goto(f"{server}/claims/c/{CLUSTER}/ml-train/{claim.name}/diagnosis/")
    assert "cannot allocate all claims" in page.inner_text("#scheduler")
    assert "held by" in page.inner_text("#ours")
    assert page.locator("table.holders tr").count() > 1
    screenshot(page, "pending-diagnosis-capacity")
    assert page.console_errors == []
    page.click("text=B200 GPUs on the heatmap")
    page.wait_for_url("**/fleet/heatmap/?cluster=sim&model=B200")
    page.wait_for_selector("#live[data-state=live]")
    assert page.console_errors == []


def test_will_it_fit_diagnoses_a_pasted_claim_and_explains_bad_yaml(server, page):
    log_in(page, server)
    open_pending(page, server)
    page.fill("textarea[name=spec]", "kind: ResourceClaim\nspec: [unclosed")
    page.click("#whatif button[type=submit]")
    page.wait_for_selector("#whatif-error")
    assert "invalid YAML" in page.inner_text("#whatif-error")
    # The form answers 400 (bad input), which Chromium logs; nothing else may have failed.
    assert [e for e in page.console_errors if "status of 400" not in e] == []
    page.console_errors.clear()
    page.fill("textarea[name=spec]", CLAIM_YAML)
    page.click("#whatif button[type=submit]")
    page.wait_for_selector("#whatif-result .diagnosis")
    assert page.get_attribute("#whatif-result .diagnosis", "data-category") == "capacity"
    assert "B200" in page.inner_text("#whatif-result table.device-groups")
    screenshot(page, "pending-whatif")
    page.locator("#whatif").screenshot(path=str(ARTIFACTS / "pending-whatif-result.png"))
    assert page.console_errors == []


def test_a_diagnosis_change_appears_live_without_reload(server, page):
    expected = expected_monday()
    log_in(page, server)
    open_pending(page, server)
    assert ("capacity", expected.big_pending) in [tuple(s) for s in sections(page)]
    page.evaluate("window.notReloaded = true")

    def free_the_big_gpus():
        # The Friday pretraining jobs finish: their claims go away; the next recomputation finds that the
        # big-memory claims fit now (the scheduler has not retried yet).
        cluster = Cluster.objects.get(name=CLUSTER)
        changes = []
        for claim in ResourceClaim.objects.filter(cluster=cluster, name__startswith="pretrain-"):
            raw = dict(claim.raw)
            raw["metadata"] = {
                **raw["metadata"],
                "resourceVersion": str(int(raw["metadata"]["resourceVersion"]) + 1),
            }
            changes.append(ingest.Change("delete", normalize("ResourceClaim", raw)))
        ingest.apply_batch(cluster, "ResourceClaim", changes)
        recompute_diagnoses(CLUSTER)

    in_thread(free_the_big_gpus)
    # The claim deletion (ingest) and the stored diagnoses (task) each announce a change; the page may show
    # the recomputation half done in between, so wait for the final state.
    page.wait_for_function(
        """n => [...document.querySelectorAll('section.cause')].some(
               e => e.dataset.cause.startsWith('fits-') && Number(e.dataset.count) === n)""",
        arg=expected.big_pending,
        timeout=LIVE_DEADLINE_MS,
    )
    shown = [tuple(s) for s in sections(page)]
    assert ("fits", expected.big_pending) in shown
    assert not any(c == "capacity" for c, _ in shown)
    assert page.evaluate("window.notReloaded === true")
    assert page.evaluate("window.pendingStats.refreshes") >= 1
    screenshot(page, "pending-live-after-change")
    assert page.console_errors == []
