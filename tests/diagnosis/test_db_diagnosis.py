"""Diagnoses from the database: the snapshot, the debounced task that stores them, and the API views."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from rest_framework.test import APIRequestFactory, force_authenticate

from claims import tasks
from claims.api.diagnosis import ClaimDiagnosisView, WhatIfView
from claims.diagnosis import diagnose
from claims.fleetstate import FleetState
from claims.models import ClaimDiagnosis, DiagnosisShape, PendingCause
from fleet.access.visibility import grant_all_namespaces
from fleet.models import ResourceClaim
from simulator import nvidia
from tests.diagnosis.fleet import CAP
from tests.stored_diagnoses import stored_results

pytestmark = pytest.mark.django_db
FLEET = Path(__file__).resolve().parents[1] / "fixtures" / "fleet-small.yaml"


@pytest.fixture
def imported() -> None:
    if connection.vendor != "postgresql":
        pytest.fail(f"database tests need PostgreSQL, got {connection.vendor}")
    call_command("import_snapshot", str(FLEET), cluster="fixtures", stdout=StringIO())


@pytest.fixture
def user() -> Any:
    # Sees every namespace: this suite is not about visibility (tests/security/ is).
    user = get_user_model().objects.create_user("oncall", password="x-long-enough-password")
    grant_all_namespaces(user)
    return user


def test_the_database_snapshot_diagnoses_like_the_files(imported: None) -> None:
    from_db = FleetState.from_db("fixtures")
    from_files = FleetState.from_files([FLEET])
    for name in ("finetune-70b-0-gpus-ffxl7", "giant-kv-0-gpu-bn7nn", "bad-selector-0-gpu-zfg9h"):
        a = diagnose(from_db, from_db.find("ResourceClaim", "research", name) or {})
        b = diagnose(from_files, from_files.find("ResourceClaim", "research", name) or {})
        assert (a.category, a.summary) == (b.category, b.summary)


def test_recompute_stores_one_timed_diagnosis_per_pending_claim(imported: None) -> None:
    counts = tasks.recompute_diagnoses("fixtures")
    assert counts == {"capacity": 1, "no-match": 1, "cel-error": 1}
    stored = {d.claim.name: d for d in ClaimDiagnosis.objects.select_related("claim", "shape")}
    assert set(stored) == set(ResourceClaim.objects.filter(state="pending").values_list("name", flat=True))
    assert all(d.computed_at is not None and d.result["summary"] == d.summary for d in stored.values())


def test_a_recompute_drops_the_diagnoses_of_claims_no_longer_pending_in_its_cluster_only(
    imported: None,
) -> None:
    call_command("import_snapshot", str(FLEET), cluster="other", stdout=StringIO())
    for name in ("fixtures", "other"):
        tasks.recompute_diagnoses(name)
    before = {
        (d.claim.cluster.name, d.claim.name) for d in ClaimDiagnosis.objects.select_related("claim__cluster")
    }
    bound = ResourceClaim.objects.get(cluster__name="fixtures", name="giant-kv-0-gpu-bn7nn")
    assert ("fixtures", bound.name) in before and ("other", bound.name) in before
    ResourceClaim.objects.filter(pk=bound.pk).update(state="allocated")  # as ingest stores an allocation

    tasks.recompute_diagnoses("fixtures")
    after = {
        (d.claim.cluster.name, d.claim.name) for d in ClaimDiagnosis.objects.select_related("claim__cluster")
    }
    assert after == before - {("fixtures", bound.name)}  # the other cluster's diagnoses are its own


def test_a_recompute_stores_chunk_by_chunk_and_names_the_diagnoses_it_found_out_of_date(
    imported: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Causes (each claim's whole result) are written a chunk at a time (6,000 results are ~30 MB of text
    # at XL, ~180 MB decoded).
    monkeypatch.setattr(tasks, "STORE_CHUNK", 2)
    chunks: list[int] = []
    record = tasks.record_causes

    def spy(diagnosed: list[Any], *args: Any) -> Any:
        chunks.append(len(diagnosed))
        return record(diagnosed, *args)

    monkeypatch.setattr(tasks, "record_causes", spy)
    assert tasks.recompute_diagnoses("fixtures") == {"capacity": 1, "no-match": 1, "cel-error": 1}
    assert chunks == [2, 1]
    first = stored_results()
    assert len(first) == 3 and PendingCause.objects.filter(cluster__name="fixtures").count() == 3
    # Two of the three out of date (each claim has a shape of its own here): both counted and rewritten.
    ids = sorted(first)
    DiagnosisShape.objects.filter(claimdiagnosis__claim_id__in=[ids[0], ids[2]]).update(
        result={"category": "stale"}
    )
    with caplog.at_level("WARNING", logger="claims.tasks"):
        tasks.recompute_diagnoses("fixtures")
    assert "2 stored diagnoses of fixtures were out of date" in caplog.text
    assert stored_results() == first


def test_a_recompute_that_fails_in_a_later_chunk_stores_nothing_and_the_next_update_recomputes(
    imported: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One transaction for every chunk: a page never shows half old, half new diagnoses of one fleet.
    monkeypatch.setattr(tasks, "STORE_CHUNK", 2)
    monkeypatch.setattr(tasks.update_diagnoses, "apply_async", lambda *a, **kw: None)
    tasks.forget()
    tasks.recompute_diagnoses("fixtures")
    first = stored_results()
    DiagnosisShape.objects.update(result={"category": "stale"})
    stale = stored_results()
    record = tasks.record_causes
    calls: list[int] = []

    def fails_on_the_second_chunk(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("connection lost")
        return record(*args, **kwargs)

    monkeypatch.setattr(tasks, "record_causes", fails_on_the_second_chunk)
    with pytest.raises(RuntimeError, match="connection lost"):
        tasks.recompute_diagnoses("fixtures")
    assert stored_results() == stale
    monkeypatch.setattr(tasks, "record_causes", record)
    try:
        assert tasks.update_diagnoses("fixtures").get("full") == 1
    finally:
        tasks.forget()
    assert stored_results() == first


def test_a_recompute_task_waits_its_turn_and_the_running_one_enqueues_the_rerun(
    imported: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(str(settings.REDIS_URL))
    running, rerun = "claimscope:diagnoses:running:fixtures", "claimscope:diagnoses:rerun:fixtures"
    client.delete(running, rerun)
    enqueued: list[Any] = []
    monkeypatch.setattr(tasks.update_diagnoses, "apply_async", lambda **kw: enqueued.append(kw))

    client.set(running, "another-worker", ex=60)  # a recompute of the cluster is running elsewhere
    assert tasks.recompute_diagnoses.apply(args=["fixtures"]).get() == {}
    assert not ClaimDiagnosis.objects.exists() and client.get(rerun) == b"1"

    client.delete(running)  # it ended without seeing the flag; the next run does the work and the rerun
    assert tasks.recompute_diagnoses.apply(args=["fixtures"]).get() == {
        "capacity": 1,
        "no-match": 1,
        "cel-error": 1,
    }
    assert enqueued == [{"args": ["fixtures"]}]  # an update: it applies what changed meanwhile
    assert client.get(running) is None and client.get(rerun) is None  # released, flag consumed


def test_fleet_changes_within_the_debounce_window_enqueue_once() -> None:
    redis.Redis.from_url(str(settings.REDIS_URL)).delete(tasks._marker("debounce-test"))
    assert tasks.on_fleet_change({"cluster": "debounce-test", "kind": "ResourceSlice"}) is True
    assert tasks.on_fleet_change({"cluster": "debounce-test", "kind": "Pod"}) is False
    assert tasks.on_fleet_change({"cluster": "other", "kind": "WatchCursor"}) is False


def test_claim_diagnosis_endpoint_returns_the_stored_result(imported: None, user: Any) -> None:
    tasks.recompute_diagnoses("fixtures")
    claim = ResourceClaim.objects.get(name="giant-kv-0-gpu-bn7nn")
    request = APIRequestFactory().get(f"/api/v1/claims/{claim.pk}/diagnosis")
    force_authenticate(request, user)
    response = ClaimDiagnosisView.as_view()(request, pk=claim.pk)
    assert response.status_code == 200
    assert response.data["category"] == "no-match"
    assert response.data["computed_at"] == ClaimDiagnosis.objects.get(claim=claim).computed_at


def test_a_claim_diagnosis_get_answers_without_writing_diagnoses_or_causes(imported: None, user: Any) -> None:
    tasks.recompute_diagnoses("fixtures")
    stored, fresh = ResourceClaim.objects.filter(state="pending").order_by("name")[:2]
    ClaimDiagnosis.objects.filter(claim=fresh).delete()  # one claim the task has not diagnosed yet

    def tables() -> tuple[list[Any], list[Any]]:
        return (
            list(ClaimDiagnosis.objects.order_by("pk").values()),
            list(PendingCause.objects.order_by("pk").values()),
        )

    before = tables()
    for claim in (stored, fresh):
        request = APIRequestFactory().get(f"/api/v1/claims/{claim.pk}/diagnosis")
        force_authenticate(request, user)
        response = ClaimDiagnosisView.as_view()(request, pk=claim.pk)
        assert response.status_code == 200
        assert response.data["claim_id"] == claim.pk and response.data["category"]
    assert tables() == before
    assert not ClaimDiagnosis.objects.filter(claim=fresh).exists()


def test_whatif_accepts_yaml_and_json_and_rejects_garbage(imported: None, user: Any) -> None:
    template = nvidia.claim_template(
        "team",
        "t",
        [
            nvidia.exactly_request(
                "gpu", "gpu.nvidia.com", 1, [f"{CAP}.memory.compareTo(quantity('40Gi')) >= 0"]
            )
        ],
    )
    factory = APIRequestFactory()
    for body, content_type in (
        (yaml.safe_dump(template), "application/yaml"),
        (nvidia_json(template), "application/json"),
    ):
        request = factory.post("/api/v1/whatif", body, content_type=content_type)
        force_authenticate(request, user)
        response = WhatIfView.as_view()(request)
        assert response.status_code == 200, response.data
        assert set(response.data) >= {"category", "summary", "requests", "suggestions", "placement", "lint"}
    request = factory.post("/api/v1/whatif", "kind: [", content_type="application/yaml")
    force_authenticate(request, user)
    response = WhatIfView.as_view()(request)
    assert response.status_code == 400
    assert "invalid YAML" in response.data["detail"]


def test_whatif_requires_authentication(imported: None) -> None:
    request = APIRequestFactory().post("/api/v1/whatif", "{}", content_type="application/json")
    assert WhatIfView.as_view()(request).status_code in (401, 403)


def nvidia_json(obj: dict[str, Any]) -> str:
    import json

    return json.dumps(obj)


def test_explain_reads_the_database_when_no_fleet_file_is_given(imported: None) -> None:
    import json

    out = StringIO()
    call_command("explain", "research/giant-kv-0", "--cluster", "fixtures", "--json", stdout=out)
    assert json.loads(out.getvalue())["category"] == "no-match"


def test_explain_names_an_unknown_cluster() -> None:
    from django.core.management import CommandError

    with pytest.raises(
        CommandError, match="unknown cluster 'nope' \\(or pass --fleet FILE to run offline\\)"
    ):
        call_command("explain", "a/b", "--cluster", "nope", stdout=StringIO())


def test_a_stored_device_taint_rule_taints_the_device_in_the_database_diagnosis(tmp_path: Path) -> None:
    """Imported like any kind; the diagnosis from the database names the rule, as from the files."""
    import json

    taint = {"key": "example.com/maintenance", "value": "planned", "effect": "NoExecute"}
    objects = [
        *nvidia.device_classes(),
        nvidia.node_object("a", "H100", gpus=1),
        *nvidia.node_slices("a", "H100", gpus=1),
        nvidia.device_taint_rule("drain-a", taint, driver="gpu.nvidia.com", pool="a"),
        nvidia.claim_object("team", "want", [nvidia.exactly_request("gpu", "gpu.nvidia.com")]),
    ]
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump_all(objects))
    call_command("import_snapshot", str(path), cluster="ruled", stdout=StringIO())
    out = StringIO()
    call_command("explain", "team/want", "--cluster", "ruled", "--json", stdout=out)
    result = json.loads(out.getvalue())
    assert result["category"] == "taint"
    assert "example.com/maintenance=planned:NoExecute by DeviceTaintRule drain-a (1)" in result["summary"]
    files = FleetState.from_files([path])
    assert diagnose(files, files.find("ResourceClaim", "team", "want") or {}).summary == result["summary"]


def test_an_unchanged_cause_is_refreshed_once_a_minute_and_a_new_cause_at_once(imported: None) -> None:
    tasks.recompute_diagnoses("fixtures")
    d = ClaimDiagnosis.objects.select_related("claim", "shape").get(shape__category="capacity")
    t0, recorded = d.computed_at, tasks.Recorded()
    shape, claim = d.shape, d.claim
    item = tasks.Diagnosed(
        shape.key, json.dumps(shape.result), shape.named, claim.name, claim.uid, d.pod_name
    )
    said = {item.key: tasks.ShapeSaid(d.category, d.summary, d.group_key)}

    def record(seconds: int) -> Any:
        recorded.update(
            tasks.record_causes([(d.claim, item)], said, t0 + timedelta(seconds=seconds), recorded)
        )
        return PendingCause.objects.get(uid=d.claim.uid, category=said[item.key].category).last_seen - t0

    assert record(0) == timedelta(0)
    assert record(30) == timedelta(0)  # the same cause 30 s later: left alone
    assert record(61) == timedelta(seconds=61)  # past CAUSE_REFRESH: refreshed
    other = {**d.result, "category": "no-match"}
    said[item.key] = tasks.ShapeSaid("no-match", d.summary, tasks.cause_key("fixtures", d.claim, other))
    assert record(62) == timedelta(seconds=62)  # another cause: recorded at once
    kept = PendingCause.objects.get(uid=d.claim.uid, category="capacity")
    assert kept.result == d.result and kept.name == d.claim.name
    assert sorted(PendingCause.objects.filter(uid=d.claim.uid).values_list("category", flat=True)) == [
        "capacity",
        "no-match",
    ]
