"""Each /api/v1/ endpoint on the fixture fleet (counts from EXPECTED.json) and on the simulated fleet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.api.conftest import all_rows, results

EXPECTED = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "EXPECTED.json").read_text())
LISTS = (
    "clusters", "streams", "nodes", "devices", "gpus", "slices", "device-classes", "claims", "pods", "events",
    "pending", "leaks", "history",
)  # fmt: skip


@pytest.mark.usefixtures("fixture_fleet")
class TestOnTheFixtureFleet:
    def test_clusters_lists_the_imported_cluster(self, api):
        assert [c["name"] for c in results(api.get("/api/v1/clusters/"))] == ["fixtures"]

    def test_nodes_and_device_classes_match_the_fixture(self, api):
        assert len(all_rows(api, "/api/v1/nodes/")) == EXPECTED["nodes"]
        assert len(all_rows(api, "/api/v1/device-classes/")) == EXPECTED["device_classes"]
        assert len(all_rows(api, "/api/v1/slices/")) == EXPECTED["resource_slices"]

    def test_devices_count_allocated_per_model_and_kind_like_expected(self, api):
        devices = all_rows(api, "/api/v1/devices/", model="H100", kind="mig")
        expected = EXPECTED["devices"]
        assert len(devices) == expected["H100/mig/static"]["total"] + expected["H100/mig/dynamic"]["total"]
        allocated = [d for d in devices if d["allocated"]]
        assert (
            len(allocated)
            == expected["H100/mig/static"]["allocated"] + expected["H100/mig/dynamic"]["allocated"]
        )
        assert all(d["claim"] and "/" in d["claim"] for d in allocated)
        b200 = all_rows(api, "/api/v1/devices/", model="B200", state="allocated")
        assert len(b200) == expected["B200/gpu"]["allocated"]

    def test_device_filters_by_mig_profile(self, api):
        rows = all_rows(api, "/api/v1/devices/", model="H200", profile="3g.71gb")
        assert len(rows) == EXPECTED["mig_profiles"]["H200/3g.71gb/static"]["total"]
        assert {r["mig_profile"] for r in rows} == {"3g.71gb"}

    def test_device_detail_has_attributes_and_unknown_ids_are_404(self, api):
        first = results(api.get("/api/v1/devices/", {"page_size": 1}))[0]
        detail = api.get(f"/api/v1/devices/{first['id']}/").json()
        assert detail["name"] == first["name"] and isinstance(detail["attributes"], dict)
        missing = api.get("/api/v1/devices/987654321/")
        assert missing.status_code == 404 and "987654321" in missing.json()["detail"]
        assert api.get(f"/api/v1/devices/{2**70}/").status_code == 404

    def test_gpus_are_physical_gpus_with_their_mig_devices(self, api):
        gpus = all_rows(api, "/api/v1/gpus/")
        by_model: dict[str, int] = {}
        for gpu in gpus:
            by_model[gpu["model"]] = by_model.get(gpu["model"], 0) + 1
        assert by_model == EXPECTED["physical_gpus"]
        h200 = [g for g in gpus if g["model"] == "H200"]
        assert all(len(g["mig"]) == 2 and {m["mig_profile"] for m in g["mig"]} == {"3g.71gb"} for g in h200)
        slices = sum(g["allocated_fraction"] * 7 for g in h200)
        assert round(slices) == EXPECTED["compute_slices"]["H200"]["allocated"]

    def test_summary_is_partition_aware(self, api):
        body = api.get("/api/v1/summary/").json()
        assert [c["cluster"] for c in body["clusters"]] == ["fixtures"]
        models = {m["model"]: m for m in body["total"]["models"]}
        for model, counts in EXPECTED["compute_slices"].items():
            assert models[model]["compute_slices"] == counts["total"]
            assert models[model]["compute_slices_allocated"] == counts["allocated"]
            assert models[model]["gpus"] == EXPECTED["physical_gpus"][model]
        groups = {(g["model"], g["profile"]): g for g in body["total"]["groups"] if g["kind"] == "mig"}
        assert groups[("H200", "3g.71gb")]["allocated"] == 3

    def test_summary_of_an_unknown_cluster_is_empty(self, api):
        body = api.get("/api/v1/summary/", {"cluster": "nope"}).json()
        assert body["clusters"] == [] and body["total"]["devices"] == 0

    def test_summary_follows_ingest_at_once(self, api):
        from fleet import ingest
        from fleet.models import Cluster, ResourceClaim
        from fleet.normalize import normalize

        before = api.get("/api/v1/summary/").json()["total"]["allocated"]
        claim = ResourceClaim.objects.get(namespace="ml-train", name="notebook-alice-gpu")
        change = ingest.Change("delete", normalize("ResourceClaim", claim.raw))
        ingest.apply_batch(Cluster.objects.get(name="fixtures"), "ResourceClaim", [change])
        assert api.get("/api/v1/summary/").json()["total"]["allocated"] == before - 1

    def test_a_clusters_summary_is_its_part_of_the_whole(self, api):
        from fleet.api import selectors as api_selectors
        from fleet.models import Cluster

        cid = Cluster.objects.get(name="fixtures").pk
        body = api.get("/api/v1/summary/", {"cluster": "fixtures"}).json()
        assert body == api_selectors.compute_summary(cid)

    def test_claims_by_state(self, api):
        claims = all_rows(api, "/api/v1/claims/")
        assert len(claims) == EXPECTED["claims"]["total"]
        pending = all_rows(api, "/api/v1/claims/", state="pending")
        assert len(pending) == EXPECTED["claims"]["pending"]
        held = [c for c in claims if c["state"] in ("allocated", "reserved")]
        assert all(c["devices"] for c in held)

    def test_claims_filter_by_the_model_of_their_devices(self, api):
        b300 = all_rows(api, "/api/v1/claims/", model="B300")
        assert b300 and all(any("b300" in d for d in c["devices"]) for c in b300)

    def test_pending_claims_carry_the_schedulers_message_and_no_diagnosis_before_one_ran(self, api):
        rows = all_rows(api, "/api/v1/pending/")
        assert len(rows) == EXPECTED["claims"]["pending"]
        assert all(r["diagnosis"] is None for r in rows)
        messages = [r["scheduler_message"] for r in rows if r["scheduler_message"]]
        assert EXPECTED["unschedulable_message"] in messages

    def test_pending_claims_carry_their_latest_diagnosis_once_computed(self, api):
        from claims.tasks import recompute_diagnoses

        recompute_diagnoses("fixtures")
        rows = all_rows(api, "/api/v1/pending/")
        assert rows and all(r["diagnosis"] and r["diagnosis"]["category"] for r in rows)
        assert all(r["diagnosis"]["summary"] for r in rows)

    def test_leaks_are_allocated_claims_nobody_reserved(self, api):
        rows = all_rows(api, "/api/v1/leaks/")
        assert [f"{r['namespace']}/{r['name']}" for r in rows] == EXPECTED["leaked_claims"]
        assert all_rows(api, "/api/v1/leaks/", older_than="3650d") == []

    def test_pods_and_events(self, api):
        assert len(all_rows(api, "/api/v1/pods/")) == EXPECTED["pods"]["total"]
        failed = all_rows(api, "/api/v1/events/", reason="FailedScheduling")
        assert len(failed) == EXPECTED["events"]["FailedScheduling"]

    def test_heatmap_has_a_cell_per_physical_gpu(self, api):
        body = api.get("/api/v1/heatmap/").json()
        assert body["summary"]["gpus"] == EXPECTED["physical_gpus_total"]
        assert len(body["rows"]) == EXPECTED["nodes"]
        bad = api.get("/api/v1/heatmap/", {"state": "sideways"})
        assert bad.status_code == 400 and "state" in bad.json()

    def test_age_filter_keeps_old_objects_only(self, api):
        assert len(all_rows(api, "/api/v1/nodes/", age="1d")) == EXPECTED["nodes"]  # created in March
        assert all_rows(api, "/api/v1/nodes/", age="3650d") == []


class TestOnTheSimulatedFleet:
    def test_every_list_endpoint_answers_with_rows(self, api, sim_fleet):
        from fleet.tasks.history import sample_allocation

        sample_allocation()
        for name in LISTS:
            rows = all_rows(api, f"/api/v1/{name}/")
            assert rows, name

    def test_simulated_pending_claims_and_leak(self, api, sim_fleet):
        pending = all_rows(api, "/api/v1/pending/", cluster="sim")
        assert len(pending) == 17
        assert any(r["scheduler_message"] for r in pending)
        assert all(r["cluster"] == "sim" for r in pending)
        leaks = all_rows(api, "/api/v1/leaks/")
        assert len(leaks) == 1 and leaks[0]["state"] == "allocated"

    def test_summary_matches_the_device_list(self, api, sim_fleet):
        body = api.get("/api/v1/summary/", {"cluster": "sim"}).json()
        devices = all_rows(api, "/api/v1/devices/")
        assert body["total"]["devices"] == len(devices)
        assert body["total"]["allocated"] == sum(d["allocated"] for d in devices)

    def test_cursor_pages_cover_every_row_once(self, api, sim_fleet):
        ids = [d["id"] for d in all_rows(api, "/api/v1/devices/", page_size=7, ordering="-name")]
        assert len(ids) == len(set(ids)) == len(all_rows(api, "/api/v1/devices/"))


class TestBadParameters:
    @pytest.mark.parametrize(
        ("url", "param", "value"),
        [
            ("/api/v1/claims/", "state", "stuck"),
            ("/api/v1/devices/", "kind", "fpga"),
            ("/api/v1/devices/", "ordering", "memory"),
            ("/api/v1/nodes/", "age", "yesterday"),
            ("/api/v1/nodes/", "page_size", "0"),
            ("/api/v1/nodes/", "page_size", "100001"),
            ("/api/v1/pods/", "cursor", "not-a-cursor"),
            ("/api/v1/pods/", "cursor", "cD1hYmM="),  # p=abc: not an id
            ("/api/v1/history/", "since", "last week"),
            ("/api/v1/leaks/", "older_than", "-5"),
            ("/api/v1/devices/", "model", "H\x00100"),
            ("/api/v1/devices/", "tainted", "null"),
            ("/api/v1/devices/", "format", "xml"),
            ("/api/v1/devices/", "format", ""),  # an empty one must not pass as JSON
            ("/api/v1/nodes/", "cluster", ""),
        ],
    )
    def test_a_bad_parameter_is_a_400_naming_it(self, api, url, param, value):
        response = api.get(url, {param: value, **({"ordering": "id"} if param == "cursor" else {})})
        assert response.status_code == 400, response.content
        assert param in response.json()


def test_dates_with_offsets_postgresql_refuses_are_compared_in_utc(api, fixture_fleet):
    response = api.get(
        "/api/v1/history/", {"since": "0719-05-03T21:36:11Z", "until": "0908-11-11T11:08:58+17:19"}
    )
    assert response.status_code == 200 and response.json()["results"] == []
    assert api.get("/api/v1/history/", {"since": "0001-01-01T00:00:00+10:00"}).status_code == 200


class TestAuth:
    @pytest.mark.parametrize("name", [*LISTS, "summary", "heatmap"])
    def test_anonymous_requests_are_refused(self, client, name):
        response = client.get(f"/api/v1/{name}/")
        assert response.status_code == 401

    def test_schema_and_docs_need_a_login(self, client):
        assert client.get("/api/schema/").status_code == 401
        assert client.get("/api/docs/").status_code == 302

    def test_a_token_authenticates_until_revoked(self, client, token):
        from fleet.models import ApiToken

        header = {"HTTP_AUTHORIZATION": f"Token {token}"}
        assert client.get("/api/v1/clusters/", **header).status_code == 200
        ApiToken.objects.all().delete()
        assert client.get("/api/v1/clusters/", **header).status_code == 401

    def test_users_are_throttled(self, api, monkeypatch):
        from rest_framework.throttling import UserRateThrottle

        monkeypatch.setattr(UserRateThrottle, "THROTTLE_RATES", {"user": "3/min", "anon": "3/min"})
        codes = [api.get("/api/v1/clusters/").status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]

    def test_the_api_is_read_only(self, api):
        assert api.post("/api/v1/clusters/", {"name": "x"}).status_code == 405
        assert api.delete("/api/v1/clusters/1/").status_code == 405
