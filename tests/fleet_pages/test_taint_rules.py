"""DeviceTaintRules count as taints wherever a device's own taints do: the device rows, the per-GPU read
model and the fleet counts, on both databases, whichever of rule and slice changes first."""

from __future__ import annotations

import copy

from fleet import selectors
from fleet.models import Device, GpuState
from fleet.taint_rules import RULE_KEY
from tests.fleet_pages.conftest import FleetEditor
from tests.fleet_pages.test_gpu_state import assert_read_model_is_current


def tainted_devices(pool: str) -> set[str]:
    rows = Device.objects.filter(tainted=True, pool=pool)
    return set(rows.values_list("name", flat=True))


def test_a_rule_taints_the_one_device_it_selects_in_every_count(editor: FleetEditor):
    target = editor.gpu_slices()[0]
    pool = target["spec"]["pool"]["name"]
    device = target["spec"]["devices"][0]["name"]
    before = selectors.fleet_summary_per_device().as_dict()
    assert device not in tainted_devices(pool)
    selector = {"driver": "gpu.nvidia.com", "pool": pool, "device": device}
    editor.taint_rule("drain-one", selector)
    assert tainted_devices(pool) == {device}
    (row,) = Device.objects.filter(pool=pool, name=device).values_list("taints", flat=True)
    assert row == [
        {
            "key": "example.com/maintenance",
            "value": "drain-one",
            "effect": "NoSchedule",
            RULE_KEY: "drain-one",
        }
    ]
    gpu = GpuState.objects.get(pool=pool, gpu_uuid=Device.objects.get(pool=pool, name=device).gpu_uuid)
    assert gpu.tainted
    assert gpu.taints == ["example.com/maintenance=drain-one:NoSchedule by DeviceTaintRule drain-one"]
    after = selectors.fleet_summary_per_device().as_dict()
    assert sum(g["tainted"] for g in after["groups"]) == sum(g["tainted"] for g in before["groups"]) + 1
    assert_read_model_is_current(editor.cluster.pk)

    # The slice is published again (a new generation of its devices' rows): the rule still applies.
    editor.upsert("ResourceSlice", copy.deepcopy(target))
    assert tainted_devices(pool) == {device}
    assert_read_model_is_current(editor.cluster.pk)

    # Deleting the rule untaints the device; the counts are as before.
    editor.delete("DeviceTaintRule", editor.taint_rule("drain-one", selector))
    assert tainted_devices(pool) == set()
    assert selectors.fleet_summary_per_device().as_dict() == before
    assert not GpuState.objects.filter(pool=pool, tainted=True).exists()
    assert_read_model_is_current(editor.cluster.pk)


def device_keys(**where: object) -> set[tuple[str, str]]:
    return set(Device.objects.filter(**where).values_list("pool", "name"))


def test_a_rule_selects_by_driver_pool_and_device_and_none_without_a_selector(editor: FleetEditor):
    first, second = editor.gpu_slices()[:2]
    pool, other = first["spec"]["pool"]["name"], second["spec"]["pool"]["name"]
    published = device_keys(tainted=True)  # the fixture has a tainted GPU of its own
    editor.taint_rule("nothing", None)
    assert device_keys(tainted=True) == published
    editor.taint_rule("other-driver", {"driver": "example.com", "pool": pool})
    assert device_keys(tainted=True) == published
    editor.taint_rule("whole-pool", {"pool": pool})
    assert device_keys(tainted=True) == published | device_keys(pool=pool)
    # An informational rule (effect None) is listed on the devices but keeps nothing away.
    editor.taint_rule("note", {"pool": other}, effect="None")
    assert device_keys(tainted=True) == published | device_keys(pool=pool)
    assert all(
        t[-1][RULE_KEY] == "note" for t in Device.objects.filter(pool=other).values_list("taints", flat=True)
    )
    # Changing a rule's selector moves its taints.
    editor.taint_rule("whole-pool", {"pool": other})
    assert device_keys(tainted=True) == published | device_keys(pool=other)
    assert_read_model_is_current(editor.cluster.pk)


def test_a_rule_that_selects_every_device_and_a_published_taint_both_stay(editor: FleetEditor):
    target = editor.gpu_slices()[0]
    pool = target["spec"]["pool"]["name"]
    editor.taint_devices(target, 1)  # a published NoSchedule taint on the first device
    editor.taint_rule("everything", {}, effect="NoExecute")
    assert device_keys(tainted=True) == device_keys()
    first = Device.objects.get(pool=pool, name=target["spec"]["devices"][0]["name"])
    assert [t.get(RULE_KEY) for t in first.taints] == [None, "everything"]
    editor.delete("DeviceTaintRule", editor.taint_rule("everything", {}, effect="NoExecute"))
    first.refresh_from_db()
    assert [t["key"] for t in first.taints] == ["gpu.nvidia.com/xid"] and first.tainted
    assert_read_model_is_current(editor.cluster.pk)
