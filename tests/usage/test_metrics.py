"""claimscope's own /metrics: off without a token, refused with a wrong one, scraped by the real Prometheus;
the example alert rules load in promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import requests
import yaml
from django.db import connections
from prometheus_client.parser import text_string_to_metric_families

from tests.fleet_pages.server import asgi_server
from tests.usage import prom

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "k8s" / "monitoring" / "claimscope-alerts.yaml"
TOKEN = "metrics-test-token-0123456789"


def test_metrics_are_off_without_a_token(db, client, settings):
    settings.CLAIMSCOPE_METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 404


def test_metrics_refuse_a_missing_or_wrong_token(db, client, settings):
    settings.CLAIMSCOPE_METRICS_TOKEN = TOKEN
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Basic {TOKEN}").status_code == 401


def test_metrics_count_devices_and_pending_claims(cluster, client, settings):
    settings.CLAIMSCOPE_METRICS_TOKEN = TOKEN
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    devices = {
        (s.labels["model"], s.labels["kind"], s.labels["state"]): s.value
        for s in families["claimscope_devices"].samples
        if s.labels["cluster"] == "usage-test"
    }
    assert devices[("B200", "gpu", "allocated")] == 7
    assert devices[("B200", "gpu", "free")] == 1
    pending = [
        s for s in families["claimscope_pending_claims"].samples if s.labels["cluster"] == "usage-test"
    ]
    assert sum(s.value for s in pending) == 1  # finetune-0 waits for 8 B200
    assert "claimscope_watch_last_event_age_seconds" in families
    assert "claimscope_idle_allocated_devices" in families


@pytest.mark.prometheus
@pytest.mark.django_db(transaction=True)
def test_the_real_prometheus_scrapes_metrics_with_its_bearer_token(cluster, settings, monkeypatch):
    url = prom.prometheus_url()
    config = yaml.safe_load(requests.get(f"{url}/api/v1/status/config", timeout=5).json()["data"]["yaml"])
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "claimscope")
    settings.CLAIMSCOPE_METRICS_TOKEN = Path(job["authorization"]["credentials_file"]).read_text().strip()
    # The server's threads must not keep connections past the test (its database is dropped after).
    monkeypatch.setitem(connections.databases["default"], "CONN_MAX_AGE", 0)
    with asgi_server() as server:
        port = int(server.rsplit(":", 1)[1])
        with prom.target(url, "claimscope", port) as run:

            def allocated_b200() -> float | None:
                labels = f'run="{run}",cluster="usage-test",model="B200",kind="gpu",state="allocated"'
                query = f"claimscope_devices{{{labels}}}"
                result = requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=5).json()
                values = result["data"]["result"]
                return float(values[0]["value"][1]) if values else None

            assert prom.wait_for(allocated_b200, "Prometheus to scrape claimscope's /metrics") == 7
            up = requests.get(f"{url}/api/v1/query", params={"query": f'up{{run="{run}"}}'}, timeout=5).json()
            assert up["data"]["result"][0]["value"][1] == "1"


@pytest.mark.prometheus
def test_the_example_alert_rules_load_in_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: run scripts/services.sh start (apt package prometheus)")
    done = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 10 rules found" in done.stdout
