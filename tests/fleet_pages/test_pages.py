"""Fleet pages: login required, permalinks, 400s naming the bad parameter, details, constant query counts."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import orjson
import pytest
from django.contrib.staticfiles import finders
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleet.models import Cluster, Device, ResourceClaim, WatchCursor
from tests.fleet_pages.conftest import FIXTURE, FIXTURE_GPUS

PAGES = ["/fleet/", "/fleet/heatmap/", "/fleet/heatmap.json", "/fleet/mig/"]


def test_every_fleet_page_redirects_anonymous_users_to_login(client, fleet):
    detail = [
        "/fleet/c/fixtures/",
        "/fleet/c/fixtures/nodes/b200-a1/",
        "/fleet/c/fixtures/nodes/b200-a1/gpus/0/",
        "/fleet/c/fixtures/nodes/b200-a1/gpus/0/card/",
        "/fleet/c/fixtures/device/?driver=gpu.nvidia.com&pool=b200-a1&name=gpu-0",
    ]
    for path in PAGES + detail:
        response = client.get(path)
        assert response.status_code == 302 and "login" in response["Location"], path


def test_the_browsers_favicon_request_gets_the_static_icon_without_a_login(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("/favicon.svg")
    assert finders.find("favicon.svg")  # served by the static files handler, not by these views


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("state=melted", "state"),
        ("cluster=no-such-cluster", "cluster"),
        ("cluster=%2F..", "cluster"),
        ("model=%3Cscript%3E", "model"),
        ("pool=a%20b", "pool"),
        ("label=%3D%3D%3D", "label"),
    ],
)
def test_a_bad_filter_is_a_400_naming_the_parameter(signed_in, query, parameter):
    # Pages re-render their filter form with the message beside the field; the JSON view answers in a line.
    for path in PAGES:
        response = signed_in.get(f"{path}?{query}")
        assert response.status_code == 400, path
        if path.endswith(".json"):
            assert response.content.decode().startswith(f"Bad filter {parameter}:"), path
            continue
        assert response["Content-Type"].startswith("text/html"), path
        html = response.content.decode()
        assert '<form class="filters" method="get">' in html, path
        assert "Some filters were not applied" in html, path
        field = re.search(
            rf'name="{parameter}".*?</label><span class="error" role="alert">([^<]+)</span>', html, re.S
        )
        assert field, (path, parameter)


def test_the_heatmap_json_has_one_cell_per_physical_gpu(signed_in):
    body = orjson.loads(signed_in.get("/fleet/heatmap.json").content)
    assert body["summary"]["gpus"] == FIXTURE_GPUS
    assert sum(len(r[4]) for r in body["rows"].values()) == FIXTURE_GPUS
    # EXPECTED.json: allocated compute slices 77 + 14 + 18 + 9
    assert body["summary"]["compute_slices_allocated"] == 118


def test_filters_narrow_the_heatmap_and_the_page_keeps_them_as_a_permalink(signed_in):
    h100 = orjson.loads(signed_in.get("/fleet/heatmap.json?model=H100").content)
    assert {r[2] for r in h100["rows"].values()} == {"H100"} and h100["summary"]["gpus"] == 16
    tainted = orjson.loads(signed_in.get("/fleet/heatmap.json?state=tainted").content)
    assert tainted["summary"]["gpus"] == tainted["summary"]["tainted"] == 1
    labelled = orjson.loads(
        signed_in.get("/fleet/heatmap.json?label=nvidia.com/gpu.product=NVIDIA-B200").content
    )
    assert {r[1] for r in labelled["rows"].values()} == {"b200-a1", "b200-a2"}
    pool = orjson.loads(signed_in.get("/fleet/heatmap.json?pool=b300-a1").content)
    assert list(pool["rows"]) == ["fixtures/b300-a1"]
    page = signed_in.get("/fleet/heatmap/?model=H100&state=free").content.decode()
    assert "/ws/fleet/?model=H100&amp;state=free" in page or "/ws/fleet/?model=H100\\u0026state=free" in page
    assert 'href="/fleet/mig/?model=H100&amp;state=free"' in page


def test_the_overview_counts_devices_by_state_and_flags_unhealthy_streams(signed_in, fleet):
    vouched = timezone.now() + timedelta(seconds=30)  # a worker renews the lease
    WatchCursor.objects.create(
        cluster=fleet,
        kind="ResourceSlice",
        state="forbidden",
        last_error="forbidden: list",
        lease_until=vouched,
    )
    WatchCursor.objects.create(  # its worker is gone: the lease lapsed, "watching" is no longer true
        cluster=fleet,
        kind="ResourceClaim",
        state="watching",
        last_event_at=timezone.now() - timedelta(seconds=10),
        lease_until=timezone.now() - timedelta(seconds=1),
    )
    WatchCursor.objects.create(  # a quiet cluster: no event for an hour, but its worker reports
        cluster=fleet,
        kind="Node",
        state="watching",
        last_event_at=timezone.now() - timedelta(hours=1),
        lease_until=vouched,
    )
    page = signed_in.get("/fleet/").content.decode()
    assert 'id="stream-alert"' in page and "2 streams not healthy" in page
    assert 'data-status="forbidden"' in page and 'data-status="stale"' in page and 'data-status="ok"' in page
    assert "77 / 112" in page  # B200 compute slices, partition-aware
    assert "1g.10gb+me" in page


def test_the_mig_view_places_devices_and_reports_fragmentation(signed_in):
    page = signed_in.get("/fleet/mig/?model=H200").content.decode()
    assert "8 GPUs with MIG" in page
    assert "grid-column: 5 / span 3" in page  # the second 3g.71gb sits on slots 4-6
    assert "13\N{MULTIPLICATION SIGN} 3g.71gb" in page


def test_node_gpu_device_and_card_pages_show_the_published_facts(signed_in):
    node = signed_in.get("/fleet/c/fixtures/nodes/h100-m1/").content.decode()
    assert "1g.10gb" in node and "/fleet/c/fixtures/nodes/h100-m1/gpus/0/" in node
    device = Device.objects.get(cluster__name="fixtures", pool="h100-m1", name="gpu-0-mig-1g10gb-19-0")
    gpu = signed_in.get("/fleet/c/fixtures/nodes/h100-m1/gpus/0/").content.decode()
    assert device.gpu_uuid in gpu and device.name in gpu
    card = signed_in.get("/fleet/c/fixtures/nodes/h100-m1/gpus/0/card/").content.decode()
    assert device.gpu_uuid in card and "<html" not in card
    page = signed_in.get(
        "/fleet/c/fixtures/device/", {"driver": "gpu.nvidia.com", "pool": "h100-m1", "name": device.name}
    ).content.decode()
    assert "memorySlice0" in page and "parentUUID" in page
    assert signed_in.get("/fleet/c/fixtures/nodes/h100-m1/gpus/99/").status_code == 404
    assert signed_in.get("/fleet/c/fixtures/device/?driver=gpu.nvidia.com").status_code == 400


def test_the_claim_page_shows_spec_allocation_pods_and_holders(signed_in):
    claim = ResourceClaim.objects.filter(state="reserved").order_by("name")[0]
    page = signed_in.get(f"/fleet/c/fixtures/claims/{claim.namespace}/{claim.name}/").content.decode()
    assert claim.requests[0]["deviceClassName"] in page
    for allocation in claim.allocations.all():
        assert allocation.device_name in page
    assert claim.reserved_for[0]["name"] in page
    # The pods table lists the pod that uses it (found through the stored pod-claim uses, on every database).
    assert f"<tr><td>{claim.namespace}/{claim.reserved_for[0]['name']}</td>" in page


def test_the_cluster_page_lists_nodes_and_streams(signed_in):
    page = signed_in.get("/fleet/c/fixtures/").content.decode()
    assert "b200-a1" in page and "6 nodes" in page
    assert signed_in.get("/fleet/c/nowhere/").status_code == 404


@pytest.mark.parametrize(
    "path", ["/fleet/", "/fleet/heatmap.json", "/fleet/mig/", "/fleet/heatmap.json?label=x"]
)
def test_list_queries_do_not_grow_with_the_fleet(signed_in, path):
    def count() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert signed_in.get(path).status_code == 200
        return len(ctx.captured_queries)

    one = count()
    call_command("import_snapshot", str(FIXTURE), cluster="second", stdout=StringIO())
    assert Cluster.objects.count() == 2
    assert count() == one


def test_the_mig_view_shows_every_mig_gpu_and_a_dynamic_gpu_allocated_whole(signed_in):
    page = signed_in.get("/fleet/mig/").content.decode()
    assert "24 GPUs with MIG" in page
    reserved = signed_in.get("/fleet/mig/?state=reserved").content.decode()
    assert "7 GPUs with MIG" in reserved
    assert "whole GPU" in signed_in.get("/fleet/mig/?pool=h100-d1").content.decode()


def test_the_filter_bar_offers_the_models_of_the_fleets_gpus_and_mig_devices(signed_in):
    expected = sorted(set(Device.objects.filter(kind__in=("gpu", "mig")).values_list("model", flat=True)))
    assert expected
    for path in ("/fleet/", "/fleet/heatmap/", "/fleet/mig/"):
        html = signed_in.get(path).content.decode()
        select = re.search(r'<select name="model".*?</select>', html, re.S)
        assert select is not None, path
        offered = re.findall(r'<option value="([^"]+)"', select.group(0))
        assert offered == expected, path
