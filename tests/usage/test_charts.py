"""24-hour charts from Prometheus's query_range: traces per GPU, gaps as None, a clear message when Prometheus
is down or not configured; and the GPU page plots them in Chromium."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.test import Client

from fleet.access.visibility import grant_all_namespaces
from tests.fleet_pages.server import asgi_server
from tests.usage import prom
from tests.usage.conftest import CLUSTER
from usage.config import PrometheusConfig

pytestmark = pytest.mark.prometheus
PASSWORD = "correct horse battery staple"
GPU = f"/usage/series.json?cluster={CLUSTER}&node=b200-0000&index=0"


@pytest.fixture
def signed_in(client, db):
    user = get_user_model().objects.create_user("alice", password=PASSWORD)
    grant_all_namespaces(user)
    client.force_login(user)
    return client


def _values(trace) -> list[float]:
    return [v for v in trace["y"] if v is not None]


def test_a_gpu_chart_has_its_activity_and_memory_with_gaps_as_none(cluster, scraped, settings, signed_in):
    source = scraped(17)
    settings.CLAIMSCOPE_PROMETHEUS = {CLUSTER: source.config}

    def charted():
        body = signed_in.get(GPU).json()
        return body if body["activity"] and _values(body["activity"][0]) else None

    body = prom.wait_for(charted, "a chart point for b200-0000 GPU 0")
    assert body["unavailable"] is None
    assert [t["name"] for t in body["activity"]] == ["b200-0000 GPU 0"]
    assert max(_values(body["activity"][0])) < 5  # the notebook idles
    assert 0 < max(_values(body["memory"][0])) < 100
    assert None in body["activity"][0]["y"]  # the hours before the exporter existed are gaps, not 0 %
    claim = signed_in.get(
        f"/usage/series.json?cluster={CLUSTER}&namespace=ml-train&claim=" + _notebook(cluster)
    )
    assert len(claim.json()["activity"]) == 3  # its three B200s, found by the DRA labels


def _claim(cluster, prefix: str) -> str:
    from fleet.models import ResourceClaim

    return ResourceClaim.objects.get(cluster=cluster, name__startswith=prefix).name


def _notebook(cluster) -> str:
    return _claim(cluster, "notebook-x")


def test_a_claim_chart_shows_its_dynamic_mig_instance_without_dra_labels(
    cluster, scraped, settings, signed_in
):
    source = scraped(17)
    settings.CLAIMSCOPE_PROMETHEUS = {CLUSTER: source.config}
    dynamic = _claim(cluster, "chat-2g-00")  # a 2g.20gb instance created on allocation: no DRA labels
    url = f"/usage/series.json?cluster={CLUSTER}&namespace=inference&claim={dynamic}"

    def charted():
        body = signed_in.get(url).json()
        return body if body["activity"] and _values(body["activity"][0]) else None

    body = prom.wait_for(charted, "a chart point of the dynamic-MIG claim")
    assert body["unavailable"] is None
    assert [t["name"] for t in body["activity"]] == ["h100-dyn-0000 GPU 0 2g.20gb #1"]
    assert [t["name"] for t in body["memory"]] == ["h100-dyn-0000 GPU 0 2g.20gb #1"]
    assert 0 < max(_values(body["memory"][0])) < 100
    # A static MIG claim is still found by its DRA labels, and only its own instance is charted.
    static = _claim(cluster, "chat-1g-00")
    body = signed_in.get(f"/usage/series.json?cluster={CLUSTER}&namespace=inference&claim={static}").json()
    assert len(body["activity"]) == 1 and "1g.10gb" in body["activity"][0]["name"]


def test_a_chart_says_when_prometheus_is_down_or_not_configured(cluster, settings, signed_in):
    settings.CLAIMSCOPE_PROMETHEUS = {}
    assert "no Prometheus configured" in signed_in.get(GPU).json()["unavailable"]
    dead = f"http://127.0.0.1:{prom.free_port()}"
    settings.CLAIMSCOPE_PROMETHEUS = {CLUSTER: PrometheusConfig(CLUSTER, dead)}
    body = signed_in.get(GPU).json()
    assert body["unavailable"].startswith("utilization unavailable since") and dead in body["unavailable"]
    assert body["activity"] == []
    # A claim's chart asks Prometheus for its GPUs' entities first: that failing says the same.
    dynamic = _claim(cluster, "chat-2g-00")
    body = signed_in.get(f"/usage/series.json?cluster={CLUSTER}&namespace=inference&claim={dynamic}").json()
    assert body["unavailable"].startswith("utilization unavailable since") and dead in body["unavailable"]


def test_a_claim_chart_of_a_foreign_namespace_is_a_404(cluster, settings, client, db):
    settings.CLAIMSCOPE_PROMETHEUS = {CLUSTER: PrometheusConfig(CLUSTER, "http://127.0.0.1:9")}
    user = get_user_model().objects.create_user("nobody", password=PASSWORD)
    client.force_login(user)
    url = f"/usage/series.json?cluster={CLUSTER}&namespace=ml-train&claim=anything"
    assert client.get(url).status_code == 404


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_gpu_page_plots_the_last_24_hours(cluster, scraped, settings, page, monkeypatch):
    source = scraped(17)
    settings.CLAIMSCOPE_PROMETHEUS = {CLUSTER: source.config}
    monkeypatch.setitem(connections.databases["default"], "CONN_MAX_AGE", 0)
    user = get_user_model().objects.create_user("alice", password=PASSWORD)
    grant_all_namespaces(user)
    with asgi_server() as server:
        page.goto(server + "/accounts/login/")
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(server + "/")
        page.goto(f"{server}/fleet/c/{CLUSTER}/nodes/b200-0000/gpus/0/")
        page.wait_for_selector(".usage-charts[data-state=plotted]")
        assert page.locator(".usage-activity .main-svg").count() > 0
        assert page.locator(".usage-memory .main-svg").count() > 0
        assert not page.console_errors


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_the_claim_page_plots_a_dynamic_mig_instance(cluster, scraped, settings, page, monkeypatch):
    source = scraped(17)
    settings.CLAIMSCOPE_PROMETHEUS = {CLUSTER: source.config}
    monkeypatch.setitem(connections.databases["default"], "CONN_MAX_AGE", 0)
    user = get_user_model().objects.create_user("alice", password=PASSWORD)
    grant_all_namespaces(user)
    dynamic = _claim(cluster, "chat-2g-00")
    client = Client()
    client.force_login(user)
    prom.wait_for(  # Prometheus has a point of it: the page's single fetch then finds one
        lambda: client.get(
            f"/usage/series.json?cluster={CLUSTER}&namespace=inference&claim={dynamic}"
        ).json()["activity"],
        "a chart point of the dynamic-MIG claim",
    )
    with asgi_server() as server:
        page.goto(server + "/accounts/login/")
        page.fill("input[name=username]", "alice")
        page.fill("input[name=password]", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(server + "/")
        page.goto(f"{server}/fleet/c/{CLUSTER}/claims/inference/{dynamic}/")
        page.wait_for_selector(".usage-charts[data-state=plotted]")
        for chart in (".usage-activity", ".usage-memory"):
            legend = page.locator(f"{chart} .legendtext").all_text_contents()
            assert legend == ["h100-dyn-0000 GPU 0 2g.20gb #1"], (chart, legend)
        assert not page.console_errors
