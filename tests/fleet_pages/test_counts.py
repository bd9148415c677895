"""One definition of each count (fleet.counts): home, the overview, the heatmap, fleet_summary and the API
agree, explain their columns, and show taints wherever a GPU or device is shown."""

from __future__ import annotations

import copy
import re
from collections import defaultdict
from io import StringIO
from typing import Any

import orjson
import pytest
from django.core.cache import cache
from django.core.management import call_command

from fleet import selectors
from fleet.api import selectors as api_selectors
from fleet.models import Device
from fleet.quantity import format_bytes
from tests.fleet_pages.conftest import FleetEditor

TAINT = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
TAINT_TEXT = "gpu.nvidia.com/xid=79:NoSchedule"


@pytest.fixture(autouse=True)
def _empty_cache():
    cache.clear()
    yield
    cache.clear()


def reserved_whole_gpu(cluster_id: int) -> Device:
    """An untainted full-GPU device held by a reserved claim (lowest name first: deterministic)."""
    holders = selectors.allocation_holders([cluster_id])
    reserved = {k for k, held in holders.items() if any(h.state == "reserved" for h in held)}
    candidates = Device.objects.filter(cluster_id=cluster_id, kind="gpu", tainted=False)
    candidates = candidates.order_by("pool", "name")
    device = next((d for d in candidates if (d.cluster_id, d.driver, d.pool, d.name) in reserved), None)
    assert device is not None, "the fixture has a reserved whole GPU"
    return device


def taint(editor: FleetEditor, device: Device) -> None:
    """Put an XID NoSchedule taint on one device, through ingest (a new version of its slice)."""
    for s in editor.objects["ResourceSlice"]:
        spec = s["spec"]
        if spec.get("driver") != device.driver or spec.get("pool", {}).get("name") != device.pool:
            continue
        if any(d.get("name") == device.name for d in spec.get("devices") or ()):
            obj = copy.deepcopy(s)
            for d in obj["spec"]["devices"]:
                if d["name"] == device.name:
                    d["taints"] = [TAINT]
            editor.upsert("ResourceSlice", obj)
            return
    raise AssertionError(f"no slice publishes {device.name}")


def model_cells(html: str) -> dict[str, dict[str, int]]:
    """The physical-GPU table of a page (fleet/_counts.html): model -> column -> number."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for model, row in re.findall(r'<tr data-model="([^"]+)">(.*?)</tr>', html, re.S):
        for column, value in re.findall(r'data-count="(\w+)">(\d+)<', row):
            out[model][column] = int(value)
    return dict(out)


def group_cells(html: str) -> dict[str, dict[str, int]]:
    """The device table of a page: "model/kind/profile" -> column -> number."""
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for group, row in re.findall(r'<tr data-group="([^"]+)">(.*?)</tr>', html, re.S):
        for column, value in re.findall(r'data-count="(\w+)">(\d+)<', row):
            out[group][column] = int(value)
    return dict(out)


def fleet_summary_json() -> dict[str, Any]:
    out = StringIO()
    call_command("fleet_summary", "--json", stdout=out)
    return orjson.loads(out.getvalue())


def test_a_tainted_gpu_in_use_is_counted_tainted_everywhere_the_heatmap_shows_it(signed_in, editor):
    device = reserved_whole_gpu(editor.cluster.pk)
    model = device.model
    before = model_cells(signed_in.get("/").content.decode())[model]["gpus_tainted"]
    taint(editor, device)
    heat = orjson.loads(signed_in.get(f"/fleet/heatmap.json?model={model}&state=tainted").content)
    home = signed_in.get("/").content.decode()
    overview = signed_in.get("/fleet/").content.decode()
    assert model_cells(home)[model]["gpus_tainted"] == before + 1 == heat["summary"]["tainted"]
    assert model_cells(overview)[model]["gpus_tainted"] == before + 1
    group = f"{model}/gpu/"
    assert group_cells(home)[group]["tainted"] >= 1
    assert group_cells(home)[group] == group_cells(overview)[group]
    for summary in (fleet_summary_json(), api_selectors.compute_summary()["total"]):
        totals = next(m for m in summary["models"] if m["model"] == model)
        assert totals["gpus_tainted"] == before + 1
        tainted = sum(g["tainted"] for g in summary["groups"] if g["model"] == model and g["kind"] == "gpu")
        assert tainted == group_cells(home)[group]["tainted"]


def test_an_idle_tainted_device_is_unavailable_not_free(fleet):
    # Total = free + allocated + unavailable; tainted is counted in whichever state the device is.
    from fleet import counts  # here, not at the top: the other tests also run against code without it

    group = counts.GroupCount("H100", "gpu", "")
    group.add(allocated=False, reserved=False, blocked=False, tainted=True, memory=0)
    group.add(allocated=True, reserved=True, blocked=False, tainted=True, memory=0)
    group.add(allocated=False, reserved=False, blocked=False, tainted=False, memory=0)
    assert (group.total, group.free, group.reserved, group.unavailable, group.tainted) == (3, 1, 1, 1, 2)
    summary = api_selectors.compute_summary()["total"]
    for g in summary["groups"]:
        assert g["total"] == g["free"] + g["allocated"] + g["unavailable"], g


def test_taints_show_on_the_node_gpu_page_hover_card_and_device_lists(signed_in, editor):
    device = reserved_whole_gpu(editor.cluster.pk)
    taint(editor, device)
    base = f"/fleet/c/fixtures/nodes/{device.node_name}/"
    node = signed_in.get(base).content.decode()
    gpu = signed_in.get(f"{base}gpus/{device.gpu_minor}/").content.decode()
    card = signed_in.get(f"{base}gpus/{device.gpu_minor}/card/").content.decode()
    assert f"{device.name}: {TAINT_TEXT}" in node  # the node's GPU table
    assert f"{device.name}: {TAINT_TEXT}" in card
    for page in (node, gpu):
        row = re.search(
            rf'<tr data-state="reserved">(?:(?!</tr>).)*>{re.escape(device.name)}</a>.*?</tr>', page, re.S
        )
        assert row is not None and "tainted" in row.group(0) and TAINT_TEXT in row.group(0)
    assert TAINT_TEXT in gpu


def test_the_claim_page_marks_an_allocated_device_tainted(signed_in, editor):
    # Apart from the test above: on SQLite the claim page depends on the lead's fix of its JSON lookup.
    device = reserved_whole_gpu(editor.cluster.pk)
    taint(editor, device)
    holder = selectors.allocation_holders([device.cluster_id])[
        (device.cluster_id, device.driver, device.pool, device.name)
    ][0]
    claim = signed_in.get(f"/fleet/c/fixtures/claims/{holder.namespace}/{holder.name}/").content.decode()
    row = re.search(rf"{re.escape(device.name)}</a>.*?</tr>", claim, re.S)
    assert row is not None and ">tainted</strong>" in row.group(0)


def test_allocated_whole_counts_the_gpus_whose_full_gpu_device_is_allocated(signed_in, fleet):
    # "Whole 0" on home while whole-GPU devices were reserved: "Whole only" counts GPUs published without
    # MIG; a partitionable GPU allocated whole is counted in "Allocated whole".
    holders = selectors.allocation_holders([fleet.pk])
    whole: dict[str, set[str]] = defaultdict(set)
    for d in Device.objects.filter(cluster=fleet, kind="gpu").exclude(gpu_uuid=""):
        if (d.cluster_id, d.driver, d.pool, d.name) in holders:
            whole[d.model].add(d.gpu_uuid)
    partitionable_whole = Device.objects.filter(
        cluster=fleet, kind="mig", gpu_uuid__in={u for uuids in whole.values() for u in uuids}
    ).exclude(counters_consumed=[])
    assert partitionable_whole.exists(), "the fixture has a partitionable GPU allocated whole"
    home = model_cells(signed_in.get("/").content.decode())
    overview = model_cells(signed_in.get("/fleet/").content.decode())
    for model, cells in home.items():
        assert cells["gpus_whole_allocated"] == len(whole.get(model, ())), model
        assert cells["gpus_full"] + cells["gpus_static_mig"] + cells["gpus_dynamic"] == cells["gpus"], model
        assert overview[model] == cells, model
    summary = fleet_summary_json()
    assert {m["model"]: m["gpus_whole_allocated"] for m in summary["models"]} == {
        m: len(whole.get(m, ())) for m in home
    }


LABELS = ("Free", "Reserved", "Allocated, unreserved", "Unavailable", "Tainted", "Allocated whole")


def test_home_has_the_overviews_columns_each_explained(signed_in):
    home = signed_in.get("/").content.decode()
    overview = signed_in.get("/fleet/").content.decode()
    for page in (home, overview):
        headers = re.findall(r'<abbr title="([^"]+)">(?:<span[^>]*></span>)?([^<]+)</abbr>', page)
        named = {label: title for title, label in headers}
        for label in (
            "Free",
            "Reserved",
            "Allocated, unreserved",
            "Unavailable",
            "Tainted",
            "Allocated whole",
        ):
            assert named.get(label), f"{label} has no definition"
        assert "Total = Free + Reserved + Allocated, unreserved + Unavailable" in page
    gpu_groups = {k: v for k, v in group_cells(home).items() if k.split("/")[1] in ("gpu", "mig")}
    assert gpu_groups == group_cells(overview)
    for cells in group_cells(home).values():
        assert cells["total"] == cells["free"] + cells["reserved"] + cells["allocated"] + cells["unavailable"]
    memory = re.findall(r'data-memory="(\d+)">([^<]*)<', home)
    assert memory and any(int(n) >= 2**40 for n, _ in memory)
    for n, text in memory:
        assert text == format_bytes(int(n)) and re.fullmatch(r"\d+(\.\d)? [KMGTPE]?i?B", text), text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (512, "512 B"),
        (80 * 2**30, "80 GiB"),
        (634 * 2**30, "634 GiB"),
        (2933744 * 2**20, "2.8 TiB"),
        (int(1.5 * 2**40), "1.5 TiB"),
        (10 * 2**20 + 1, "10 MiB"),
    ],
)
def test_memory_is_shown_in_binary_units_chosen_by_magnitude(value, text):
    assert format_bytes(value) == text


def test_fleet_summary_prints_memory_in_one_unit_system_and_explains_its_columns(fleet):
    out = StringIO()
    call_command("fleet_summary", stdout=out)
    text = out.getvalue()
    figures = re.findall(r"(\d+(?:\.\d)?) ?([KMGTPE]?i?B|[KMGTPE]i)\s*$", text, re.M)
    assert figures, text
    for number, unit in figures:
        assert unit.endswith("B"), f"{number}{unit} is not in the binary byte units"
        assert float(number) < 1024, f"{number} {unit}: a larger unit should have been chosen"
    for column in ("unav", "taint", "wholeA", "dyn"):
        assert re.search(rf"^  {column}\s+\S", text, re.M), f"no legend line for {column}"
