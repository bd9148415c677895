"""claimscope's own /metrics: off without a token, refused with a wrong one, scraped by the real Prometheus;
the example alert rules load in promtool."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import requests
import yaml
from django.db import connections
from prometheus_client.parser import text_string_to_metric_families

from fleet import ingest
from fleet.kube.reflector import Reflector, StreamConfig
from simulator import nvidia
from simulator.cluster import SimulatedCluster
from tests.fleet_pages.server import asgi_server
from tests.usage import prom

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "k8s" / "monitoring" / "claimscope-alerts.yaml"
DASHBOARD = ROOT / "k8s" / "monitoring" / "grafana-claimscope.json"
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


def _scrape(client) -> dict:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def _relists(client, cluster: str, kind: str) -> float | None:
    family = _scrape(client)["claimscope_watch_relists"]
    assert family.type == "counter"
    found = [
        s.value
        for s in family.samples
        if s.name == "claimscope_watch_relists_total" and s.labels == {"cluster": cluster, "kind": kind}
    ]
    return found[0] if found else None


def test_metrics_count_the_relists_of_each_watch_stream(db, client, settings):
    settings.CLAIMSCOPE_METRICS_TOKEN = TOKEN
    cluster = ingest.get_or_create_cluster("relisting")
    sim = SimulatedCluster(history_limit=100)  # the API server's protocol: lists, watches, 410 Gone
    sim.create(nvidia.node_object("node-0", "H100"))
    fast = StreamConfig(flush_interval=0.05, watch_timeout=0.2, idle_timeout=5, backoff_min=0.01)
    reflector = Reflector(cluster, "Node", sim, fast)
    reflector.run(threading.Event(), max_watches=1)
    assert _relists(client, "relisting", "Node") == 0  # the first list is not a relist
    for expected in (1, 2):
        sim.create(nvidia.node_object(f"node-{expected}", "B200"))
        sim.compact()  # the history no longer reaches the cursor: the next watch gets 410 Gone
        reflector.run(threading.Event(), max_watches=1)  # 410 -> relist
        assert _relists(client, "relisting", "Node") == expected
    reflector.run(threading.Event(), max_watches=1)  # resumes from the cursor: no relist
    assert _relists(client, "relisting", "Node") == 2
    assert _relists(client, "relisting", "ResourceSlice") is None  # a stream that never ran


@pytest.mark.prometheus
@pytest.mark.django_db(transaction=True)
def test_the_real_prometheus_scrapes_metrics_with_its_bearer_token(cluster, settings, monkeypatch):
    url = prom.prometheus_url()
    config = yaml.safe_load(requests.get(f"{url}/api/v1/status/config", timeout=5).json()["data"]["yaml"])
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "claimscope")
    settings.CLAIMSCOPE_METRICS_TOKEN = Path(job["authorization"]["credentials_file"]).read_text().strip()
    # One stream that relisted once (what a relist after a 410 Gone writes with its rows).
    ingest.cursors.save_cursor(cluster, "ResourceSlice", ingest.CursorUpdate(10), relisted=True)
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
            query = f'claimscope_watch_relists_total{{run="{run}",cluster="usage-test"}}'
            relists = requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=5).json()
            kinds = {r["metric"]["kind"]: r["value"][1] for r in relists["data"]["result"]}
            assert kinds == {"ResourceSlice": "1"}


@pytest.mark.prometheus
def test_the_example_alert_rules_load_in_promtool():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: run scripts/services.sh start (apt package prometheus)")
    done = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 11 rules found" in done.stdout


def _exposed(client) -> set[str]:
    """Every series name /metrics can serve (a counter's samples are its family name + ``_total``)."""
    families = _scrape(client).values()
    return {f.name for f in families} | {f"{f.name}_total" for f in families if f.type == "counter"}


@pytest.mark.prometheus
def test_the_grafana_dashboard_queries_parse_and_name_only_served_metrics(cluster, client, settings):
    settings.CLAIMSCOPE_METRICS_TOKEN = TOKEN
    url = prom.prometheus_url()
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels), "panel ids must be unique"
    cells = [(p["gridPos"]["x"] + dx, p["gridPos"]["y"] + dy) for p in panels
             for dx in range(p["gridPos"]["w"]) for dy in range(p["gridPos"]["h"])]  # fmt: skip
    assert len(set(cells)) == len(cells), "panels overlap"
    exposed = _exposed(client)
    named: set[str] = set()
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            expr = target["expr"].replace("$cluster", ".*")
            answer = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=5).json()
            assert answer["status"] == "success", f"{panel['title']}: {answer.get('error')}"
            named |= set(re.findall(r"claimscope_[a-z_]+", expr))
    rules = yaml.safe_load(RULES.read_text())
    for rule in rules["groups"][0]["rules"]:
        named |= set(re.findall(r"claimscope_[a-z_]+", rule["expr"]))
    assert named - exposed == set(), "the dashboard or the alert rules name metrics /metrics does not serve"
    assert "claimscope_watch_relists_total" in named
