"""Idle allocations: the API (JSON, CSV, schema, errors, visibility), ``manage.py idle`` and the page.

The samples come through the same sampler as production, from the stand-in in process (no Prometheus: these
run on SQLite and PostgreSQL alike)."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from fleet.access.visibility import grant_all_namespaces
from fleet.models import NamespaceGrant
from simulator import dcgm
from usage import ingest
from usage.ingest import Thresholds
from usage.sampler import sample_cluster

LIMITS = Thresholds(below=0.05, window=timedelta(minutes=30), interval=timedelta(minutes=1))


@pytest.fixture
def sampled(cluster, sim, settings):
    """Five rounds, 10 minutes apart, ending 20 minutes ago."""
    settings.CLAIMSCOPE_IDLE_WINDOW_MINUTES = 30
    source = dcgm.InProcessSource(lambda: dcgm.cluster_series(sim.cluster, dcgm.now()))
    start = timezone.now() - timedelta(hours=1)
    for minute in range(0, 41, 10):
        assert sample_cluster(cluster, source, start + timedelta(minutes=minute), LIMITS).ok
    return cluster


@pytest.fixture
def api(db):
    user = get_user_model().objects.create_user("oncall", password="correct horse battery staple")
    grant_all_namespaces(user)
    client = APIClient()
    client.force_login(user)
    return client


def test_the_api_lists_the_idle_claim_with_its_waste(sampled, api):
    body = api.get("/api/v1/idle/").json()
    assert [c["claim"].rsplit("-", 3)[0] for c in body["claims"]] == ["notebook-x"]
    claim = body["claims"][0]
    assert (claim["namespace"], claim["model"], claim["gpus"], claim["devices"]) == (
        "ml-train",
        "B200",
        3.0,
        3,
    )
    assert claim["mean_active_percent"] < 5
    assert claim["idle_gpu_hours"] > 0
    assert body["waste"] == [
        {"namespace": "ml-train", "model": "B200", "claims": 1, "idle_gpu_hours": claim["idle_gpu_hours"]}
    ]
    assert body["unavailable_since"] is None


def test_the_claims_that_waited_for_the_idle_model_are_counted(sampled, api):
    from claims.tasks import _recompute

    _recompute(
        sampled.name, (timezone.now() - timedelta(minutes=50)).isoformat()
    )  # finetune-0 waits for B200
    claim = api.get("/api/v1/idle/").json()["claims"][0]
    assert claim["blocked"] == 1
    assert claim["blocked_examples"] == ["ml-train/" + claim["blocked_examples"][0].split("/")[1]]
    assert claim["blocked_examples"][0].startswith("ml-train/finetune-0")
    out = StringIO()
    call_command("idle", stdout=out)
    assert "while 1 claims waited for B200" in out.getvalue()


def test_a_claim_still_pending_waits_until_now_though_last_diagnosed_before_the_idle_stretch(sampled, api):
    from claims.tasks import _recompute

    # Diagnosed once, an hour before the first round; nothing changed since, so no diagnosis ran again
    # (the demo: the weekend's diagnoses, then a quiet fleet). finetune-0 is still pending.
    _recompute(sampled.name, (timezone.now() - timedelta(hours=2)).isoformat())
    claim = api.get("/api/v1/idle/").json()["claims"][0]
    assert claim["claim"].startswith("notebook-x")
    assert claim["blocked"] == 1
    assert claim["blocked_examples"][0].startswith("ml-train/finetune-0")


def test_a_claim_no_longer_pending_counts_only_while_it_was_diagnosed(sampled, api):
    from claims.tasks import _recompute
    from fleet import ingest as fleet_ingest
    from fleet.models import ResourceClaim
    from fleet.normalize import normalize

    _recompute(sampled.name, (timezone.now() - timedelta(hours=2)).isoformat())
    waiting = ResourceClaim.objects.get(cluster=sampled, name__startswith="finetune-0")
    change = fleet_ingest.Change("delete", normalize("ResourceClaim", waiting.raw))
    fleet_ingest.apply_batch(sampled, "ResourceClaim", [change])  # gone before notebook-x's first round
    assert api.get("/api/v1/idle/").json()["claims"][0]["blocked"] == 0


def test_the_below_threshold_lists_claims_by_mean_activity(sampled, api):
    names = {c["claim"].rsplit("-", 3)[0] for c in api.get("/api/v1/idle/?below=100").json()["claims"]}
    assert names == {"notebook-x", "pretrain-0", "chat-1g-00", "chat-1g-01", "chat-2g-00"}


def test_the_csv_has_one_row_per_claim_or_per_group(sampled, api):
    response = api.get("/api/v1/idle/?format=csv")
    assert response["Content-Type"].startswith("text/csv")
    lines = response.content.decode().splitlines()
    assert lines[0].split(",")[:3] == ["cluster", "namespace", "claim"]
    assert len(lines) == 2 and ",ml-train,notebook-x" in lines[1]
    waste = api.get("/api/v1/idle/?format=csv&section=waste").content.decode().splitlines()
    assert waste[0] == "namespace,model,claims,idle_gpu_hours"
    assert waste[1].startswith("ml-train,B200,1,")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("since=yesterday-ish", "since"),
        ("until=2026-13-45", "until"),
        ("below=120", "below"),
        ("below=x", "below"),
        ("section=nope", "section"),
        ("since=2026-03-09T10:00:00Z&until=2026-03-09T09:00:00Z", "since"),
        ("since=", "since"),
        ("until=0001-01-01T00:00:00Z", "since"),
        ("until=0", "until"),  # a duration needs its unit
        ("until=9999-12-31T23:00:00-05:00", "until"),  # the default start would be before year 1
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, query, field):
    response = api.get(f"/api/v1/idle/?{query}")
    assert response.status_code == 400
    assert field in response.json()


def test_a_user_sees_only_idle_claims_in_granted_namespaces(sampled):
    user = get_user_model().objects.create_user("inference-dev", password="correct horse battery staple")
    NamespaceGrant.objects.create(user=user, cluster=sampled, namespace="inference")
    client = APIClient()
    client.force_login(user)
    body = client.get("/api/v1/idle/?below=100").json()
    assert {c["namespace"] for c in body["claims"]} == {"inference"}
    assert {w["namespace"] for w in body["waste"]} == {"inference"}


def test_anonymous_requests_are_refused(db, client):
    assert APIClient().get("/api/v1/idle/").status_code in (401, 403)
    assert client.get("/usage/idle/").status_code == 302


def test_the_schema_documents_the_endpoint(api):
    schema = api.get("/api/schema/?format=json").json()
    operation = schema["paths"]["/api/v1/idle/"]["get"]
    assert {p["name"] for p in operation["parameters"]} >= {"since", "until", "below", "cluster", "section"}


def test_the_command_prints_text_json_and_csv(sampled):
    out = StringIO()
    call_command("idle", stdout=out)
    assert "3 B200 idle for " in out.getvalue()
    assert " h held by ml-train/notebook-x" in out.getvalue()
    out = StringIO()
    call_command("idle", "--format", "json", stdout=out)
    assert json.loads(out.getvalue())["claims"][0]["namespace"] == "ml-train"
    out = StringIO()
    call_command("idle", "--format", "csv", "--section", "waste", stdout=out)
    assert out.getvalue().splitlines()[1].startswith("ml-train,B200,1,")


def test_the_command_names_a_bad_argument(db):
    with pytest.raises(CommandError, match="--since"):
        call_command("idle", "--since", "last blue moon")


def test_the_page_lists_the_idle_claim_and_says_when_utilization_is_unavailable(sampled, client, api):
    user = get_user_model().objects.get(username="oncall")
    client.force_login(user)
    page = client.get("/usage/idle/").content.decode()
    assert 'id="idle-claims"' in page and "ml-train/notebook-x" in page
    assert "Utilization unavailable" not in page
    ingest.record_failure(sampled, timezone.now(), "http://prometheus: ConnectionError")
    page = client.get("/usage/idle/").content.decode()
    assert "Utilization unavailable since" in page
    assert "ml-train/notebook-x" in page  # what was sampled stays listed


def test_trends_sum_allocation_and_activity_per_model(sampled, api):
    body = api.get("/api/v1/usage-trends/?since=2h").json()
    assert body["window"]["group"] == "model" and body["window"]["resolution"] == "minute"
    assert body["window"]["gap_seconds"] == 120  # two sampling intervals: further apart, rounds were missed
    assert body["unavailable_since"] is None
    b200 = [p for p in body["points"] if p["model"] == "B200"]
    assert len(b200) == 5  # one per round
    assert {p["allocated"] for p in b200} == {7.0}  # notebook-x's 3 + pretrain-0's 4
    assert all(p["active"] < 4.5 for p in b200)  # only pretrain-0 works
    assert b200[-1]["idle"] == 3.0  # notebook-x's GPUs, idle for the 30-minute window by then
    per_namespace = api.get(
        "/api/v1/usage-trends/?since=2h&group=model,namespace&format=csv"
    ).content.decode()
    assert per_namespace.splitlines()[0].startswith("time,cluster,model,namespace,allocated")
    assert api.get("/api/v1/usage-trends/?group=pool").status_code == 400


def test_a_time_with_a_far_offset_is_read_in_utc(api):
    # PostgreSQL refuses offsets beyond 15:59; the window is compared in UTC.
    body = api.get("/api/v1/usage-trends/?since=0121-10-21T06:45:12.914-16:09").json()
    assert body["window"]["since"] == "0121-10-21T22:54:12.914000Z"


def test_the_trends_page_charts_the_points(sampled, client):
    client.force_login(get_user_model().objects.create_user("viewer", password="x-correct-horse"))
    page = client.get("/usage/trends/?since=2h").content.decode()
    assert 'id="trends-chart"' in page and 'id="trends-data"' in page
    assert client.get("/usage/trends/?since=soon").status_code == 400
