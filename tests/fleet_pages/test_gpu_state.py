"""The per-GPU read model: its rows equal the counts computed from devices and allocations, after any
sequence of batches, and a batch's incremental update equals a full rebuild."""

from __future__ import annotations

import copy
import importlib
import random
from typing import Any

from django.apps import apps as django_apps

from fleet import readmodel, selectors
from fleet.api import selectors as api_selectors
from fleet.ingest import gpu_state
from fleet.models import Device, DeviceGroupState, GpuState
from fleet.selectors import Holder
from tests.fleet_pages.conftest import FIXTURE_GPUS, FleetEditor

# The revision differs after any recompute by design (test_a_recompute_moves_the_version_the_feed_polls).
GPU_COLUMNS = [f.attname for f in GpuState._meta.concrete_fields if f.attname not in ("id", "revision")]
GROUP_COLUMNS = [f.attname for f in DeviceGroupState._meta.concrete_fields if not f.primary_key]


def stored_rows() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    gpus = sorted(map(repr, GpuState.objects.values_list(*GPU_COLUMNS)))
    groups = sorted(map(repr, DeviceGroupState.objects.values_list(*GROUP_COLUMNS)))
    return gpus, groups  # type: ignore[return-value]


def assert_read_model_is_current(cluster_id: int) -> None:
    """Rows equal the per-device counts, and what a full rebuild writes."""
    assert selectors.fleet_summary().as_dict() == selectors.fleet_summary_per_device().as_dict()
    incremental = stored_rows()
    gpu_state.refresh(cluster_id)
    assert stored_rows() == incremental


def test_the_imported_fleet_has_one_row_per_physical_gpu(fleet):
    assert GpuState.objects.filter(cluster=fleet).count() == FIXTURE_GPUS
    assert_read_model_is_current(fleet.pk)


def test_a_large_cluster_is_recomputed_in_batches_of_whole_pools_with_the_same_rows(fleet, monkeypatch):
    one_go = stored_rows()
    pools = Device.objects.filter(cluster=fleet).values("pool").distinct().count()
    # A batch limit below the fixture's device count, so the pools are read in several batches.
    monkeypatch.setattr(gpu_state, "REFRESH_DEVICES", 10)
    batches = gpu_state._pool_batches(fleet.pk)
    assert 1 < len(batches) <= pools
    assert sorted(p for b in batches for p in b or ()) == sorted(
        Device.objects.filter(cluster=fleet).values_list("pool", flat=True).distinct()
    )
    read: list[list[str] | None] = []
    rows_of_pools = gpu_state._rows_of_pools

    def spied(cluster_id: int, names: list[str] | None) -> Any:
        read.append(names)
        return rows_of_pools(cluster_id, names)

    monkeypatch.setattr(gpu_state, "_rows_of_pools", spied)
    gpu_state.refresh(fleet.pk)
    assert read == batches  # the recompute read those batches, one at a time
    assert stored_rows() == one_go
    assert GpuState.objects.filter(cluster=fleet).count() == FIXTURE_GPUS


def random_change(editor: FleetEditor, rng: random.Random) -> str:
    """One watch-like batch on the fixture fleet: taint or untaint devices, deallocate, delete or restore
    a claim, or delete or restore a slice."""
    choice = rng.choice(["taint", "untaint", "deallocate", "delete claim", "restore claim", "delete slice",
                         "restore slice"])  # fmt: skip
    slices, claims = editor.gpu_slices(), editor.allocated_claims()
    if choice in ("taint", "untaint"):
        s = rng.choice(slices)
        editor.taint_devices(s, rng.randint(1, len(s["spec"]["devices"])), on=choice == "taint")
    elif choice == "deallocate":
        editor.deallocate(rng.choice(claims))
    elif choice == "delete claim":
        editor.delete("ResourceClaim", rng.choice(claims))
    elif choice == "restore claim":
        editor.upsert("ResourceClaim", rng.choice(claims))
    elif choice == "delete slice":
        editor.delete("ResourceSlice", rng.choice(slices))
    else:
        editor.upsert("ResourceSlice", copy.deepcopy(rng.choice(slices)))
    return choice


def test_after_random_batches_the_rows_equal_the_counts_and_a_full_rebuild(editor):
    seed = random.randrange(2**32)
    print(f"seed={seed}")  # rerun a failure with this seed
    rng = random.Random(seed)
    for step in range(12):
        choice = random_change(editor, rng)
        try:
            assert_read_model_is_current(editor.cluster.pk)
        except AssertionError:
            print(f"after step {step}: {choice}")
            raise
    # The API's summary is the read model's too.
    assert api_selectors.compute_summary()["total"] == selectors.fleet_summary_per_device().as_dict()


def test_an_import_recomputes_the_read_model_once_for_all_its_kinds(db, monkeypatch):
    from io import StringIO

    from django.core.management import call_command

    from tests.fleet_pages.conftest import FIXTURE

    calls: list[tuple[int, Any]] = []
    refresh = gpu_state.refresh

    def counted(cluster_id: int, pools: Any = None) -> int:
        calls.append((cluster_id, pools))
        return refresh(cluster_id, pools)

    monkeypatch.setattr(gpu_state, "refresh", counted)
    call_command("import_snapshot", str(FIXTURE), cluster="fixtures", stdout=StringIO())
    # Slices and claims both touched every pool: one recompute of the whole cluster, not one per kind.
    assert len(calls) == 1 and calls[0][1] is None
    assert GpuState.objects.count() == FIXTURE_GPUS
    assert_read_model_is_current(calls[0][0])


def test_one_refresh_needs_the_transaction_that_applies_the_batches(transactional_db):
    import pytest

    with pytest.raises(RuntimeError, match="transaction"), gpu_state.one_refresh():
        pass


def test_a_batch_rewrites_only_the_rows_of_the_pools_it_touched(editor):
    before = {(g.pool, g.gpu_uuid): g.pk for g in GpuState.objects.all()}
    target = editor.gpu_slices()[0]
    editor.taint_devices(target, 1)
    after = {(g.pool, g.gpu_uuid): g.pk for g in GpuState.objects.all()}
    assert after.keys() == before.keys()
    rewritten = {key[0] for key in after if after[key] != before[key]}
    assert rewritten == {target["spec"]["pool"]["name"]}


def held_gpus(claim: dict[str, Any]) -> set[tuple[str, str]]:
    """(pool, GPU uuid) of the devices a claim's allocation names."""
    results = claim["status"]["allocation"]["devices"]["results"]
    return {
        (pool, uuid)
        for pool, name, uuid in Device.objects.values_list("pool", "name", "gpu_uuid")
        if uuid and any((r["pool"], r["device"]) == (pool, name) for r in results)
    }


def test_a_claim_batch_rewrites_only_the_rows_of_the_gpus_it_held(editor):
    # A claim holding one GPU of an eight-GPU node: only that GPU's row is recomputed, not its pool's.
    claim = next(
        c
        for c in editor.allocated_claims()
        if len(held_gpus(c)) == 1 and GpuState.objects.filter(pool=next(iter(held_gpus(c)))[0]).count() > 1
    )
    before = {(g.pool, g.gpu_uuid): g.pk for g in GpuState.objects.all()}
    editor.deallocate(claim)
    after = {(g.pool, g.gpu_uuid): g.pk for g in GpuState.objects.all()}
    assert after.keys() == before.keys()
    assert {key for key in after if after[key] != before[key]} == held_gpus(claim)
    assert_read_model_is_current(editor.cluster.pk)
    editor.upsert("ResourceClaim", claim)  # allocated again
    assert_read_model_is_current(editor.cluster.pk)


def test_freeing_a_dynamic_partition_recomputes_its_gpu_and_unblocks_its_siblings(editor):
    # The fixture's dynamic-MIG pool: a 3g partition of gpu-1 is allocated, which blocks the full gpu-1.
    claim = next(
        c for c in editor.objects["ResourceClaim"] if c["metadata"]["name"] == "summarize-0-mig-w4crn"
    )
    (gpu,) = held_gpus(claim)
    row = GpuState.objects.get(pool=gpu[0], gpu_uuid=gpu[1])
    assert row.counter_blocked and row.devices_allocated == 2  # with summarize-1's 1g partition
    others = {g.gpu_uuid: g.pk for g in GpuState.objects.filter(pool=gpu[0]).exclude(gpu_uuid=gpu[1])}
    editor.deallocate(claim)
    row = GpuState.objects.get(pool=gpu[0], gpu_uuid=gpu[1])
    assert row.devices_allocated == 1
    assert {g.gpu_uuid: g.pk for g in GpuState.objects.filter(pool=gpu[0]).exclude(gpu_uuid=gpu[1])} == others
    assert_read_model_is_current(editor.cluster.pk)


def test_a_holder_change_recomputes_every_gpu_sharing_a_counter_set_with_its_devices():
    # Counter sets may span GPUs: A and B draw on "s", B and C on "t", D on its own. Allocating a device of
    # A can block B's (through "s"), and B's rows need all of "t"'s users, so A, B and C are recomputed.
    def device(name: str, gpu: str, *sets: str) -> dict[str, Any]:
        d = counter_device(name, "mig", 1, 1, "1g.10gb")
        d["gpu_uuid"] = gpu
        d["counters_consumed"] = [{"counterSet": s, "counters": {"memory": {"value": "1"}}} for s in sets]
        return d

    devices = [device("a0", "A", "s"), device("b0", "B", "s", "t"), device("b1", "B", "u"),
               device("c0", "C", "t"), device("d0", "D", "v")]  # fmt: skip
    changed = {(1, "gpu.nvidia.com", "node-a", "a0")}
    moved = gpu_state.units_moved_by(devices, changed)
    assert [d["name"] for d in moved] == ["a0", "b0", "b1", "c0"]
    assert [
        d["name"] for d in gpu_state.units_moved_by(devices, {(1, "gpu.nvidia.com", "node-a", "d0")})
    ] == ["d0"]
    assert gpu_state.units_moved_by(devices, {(1, "gpu.nvidia.com", "node-a", "gone")}) == []
    # The moved units' rows are those a recompute of the whole pool gives them.
    holders = {next(iter(changed)): [Holder("team", "train", "allocated")]}
    counter_sets = {(1, "gpu.nvidia.com", "node-a"): {s: {"memory": 1} for s in "stuv"}}
    whole_gpus, whole_groups = gpu_state.rows_of(devices, holders, counter_sets)
    gpus, groups = gpu_state.rows_of(moved, holders, counter_sets)
    assert gpus == [g for g in whole_gpus if g["gpu_uuid"] != "D"]
    assert groups == [g for g in whole_groups if g["unit"] != "gpu:D"]
    assert next(g for g in gpus if g["gpu_uuid"] == "B")["partitions_unavailable"] == 1  # b0, through "s"


def counter_device(name: str, kind: str, slices: int, memory: int, profile: str = "") -> dict[str, Any]:
    return {
        "cluster_id": 1, "driver": "gpu.nvidia.com", "pool": "node-a", "name": name, "model": "B200",
        "kind": kind, "mig_profile": profile, "memory_bytes": 10 * memory, "tainted": False,
        "gpu_uuid": "GPU-0", "compute_slices": slices, "pool_generation": 1, "node_name": "node-a",
        "gpu_minor": 0, "taints": [], "product_name": "NVIDIA B200",
        "counters_consumed": [{"counterSet": "gpu-0", "counters": {"memory": {"value": str(memory)}}}],
    }  # fmt: skip


def test_a_recompute_moves_the_version_the_feed_polls_of_its_pools_only(editor):
    target = editor.gpu_slices()[0]
    key = (editor.cluster.pk, target["spec"]["driver"], target["spec"]["pool"]["name"])
    pools = selectors.pool_versions([editor.cluster.pk])
    cluster = selectors.cluster_versions([editor.cluster.pk])
    editor.taint_devices(target, 1)
    after = selectors.pool_versions([editor.cluster.pk])
    assert {k for k in pools if after.get(k) != pools[k]} == {key}
    assert selectors.cluster_versions([editor.cluster.pk]) != cluster
    # Asked for some pools, the same versions.
    assert selectors.pool_versions([editor.cluster.pk], [key]) == {key: after[key]}
    editor.delete("ResourceSlice", target)
    assert key not in selectors.pool_versions([editor.cluster.pk])  # no GPU left to show


def test_a_dynamic_mig_gpu_row_counts_partitions_blocked_by_its_allocated_sibling():
    devices = [
        counter_device("gpu-0", "gpu", 7, 8),
        counter_device("gpu-0-3g-a", "mig", 3, 4, "3g.90gb"),
        counter_device("gpu-0-3g-b", "mig", 3, 4, "3g.90gb"),
        counter_device("gpu-0-4g", "mig", 4, 5, "4g.90gb"),
    ]
    holders = {(1, "gpu.nvidia.com", "node-a", "gpu-0-3g-a"): [Holder("team", "train", "allocated")]}
    counter_sets = {(1, "gpu.nvidia.com", "node-a"): {"gpu-0": {"memory": 8}}}
    (gpu,), groups = gpu_state.rows_of(devices, holders, counter_sets)
    assert (gpu["mig"], gpu["dynamic"], gpu["whole_allocated"]) == (True, True, False)
    assert (gpu["compute_slices_used"], gpu["compute_slices_allocated"]) == (3, 3)
    # 3g-b still fits next to 3g-a (4 + 4 <= 8); the 4g (4 + 5) and the whole GPU (4 + 8) do not.
    assert (gpu["partitions_free"], gpu["partitions_unavailable"]) == (1, 1)
    assert (gpu["holders"], gpu["reserved"], gpu["unreserved"]) == (["team/train"], False, True)
    by_group = {(g["kind"], g["profile"]): g for g in groups}
    assert by_group[("gpu", "")]["unavailable"] == 1
    assert (by_group[("mig", "3g.90gb")]["allocated"], by_group[("mig", "3g.90gb")]["free"]) == (1, 1)
    # Only the allocated partition's memory counts: placements overlap.
    assert by_group[("mig", "3g.90gb")]["memory_bytes"] == 40


def test_the_overview_reads_the_same_numbers_on_every_database(fleet):
    # One code path: the counts come from the read model's rows whatever the backend.
    per_cluster = readmodel.summaries(readmodel.Scope((fleet.pk,), gpu_devices_only=True))
    expected = selectors.fleet_summary_per_device(fleet.pk)
    gpu_groups = [g for g in expected.groups if g.kind in ("gpu", "mig")]
    assert per_cluster[fleet.pk].groups == gpu_groups
    assert per_cluster[fleet.pk].models == expected.models


def test_the_migration_fills_the_read_model_from_the_stored_rows(fleet):
    migration = importlib.import_module("fleet.migrations.0008_gpu_state_revision")
    expected = stored_rows()
    GpuState.objects.all().delete()
    DeviceGroupState.objects.all().delete()
    migration.fill(django_apps, None)
    assert stored_rows() == expected and expected[0]


def stored_objects(model: Any, kind: str) -> list[dict[str, Any]]:
    """The objects as the API server would list them now (what ingest stored)."""
    return [{**raw, "kind": kind} for raw in model.objects.order_by("name").values_list("raw", flat=True)]


def test_a_relist_that_changed_some_objects_recomputes_their_pools_only(editor):
    from fleet import ingest
    from fleet.models import ResourceClaim, ResourceSlice
    from fleet.normalize import normalize

    pools = set(GpuState.objects.values_list("pool", flat=True))
    before = {(g.pool, g.gpu_uuid): g.pk for g in GpuState.objects.all()}
    # The claims relist: one allocated claim gone (deleted while unobserved), the others as stored.
    claims = stored_objects(ResourceClaim, "ResourceClaim")
    gone = next(c for c in claims if (c.get("status") or {}).get("allocation"))
    listed = [normalize("ResourceClaim", c) for c in claims if c is not gone]
    ingest.replace_all(editor.cluster, "ResourceClaim", listed, 10**20)  # newer than any stored cursor
    gone_pools = {r["pool"] for r in gone["status"]["allocation"]["devices"]["results"]}
    after = {(g.pool, g.gpu_uuid): g.pk for g in GpuState.objects.all()}
    rewritten = {key[0] for key in after if after[key] != before.get(key)}
    assert gone_pools <= rewritten < pools
    assert_read_model_is_current(editor.cluster.pk)
    # The slices relist: one slice tainted (a newer version), one gone.
    slices = stored_objects(ResourceSlice, "ResourceSlice")
    gpu_slices = [
        s for s in slices if s["spec"].get("driver") == "gpu.nvidia.com" and s["spec"].get("devices")
    ]
    tainted, gone_slice = copy.deepcopy(gpu_slices[0]), gpu_slices[1]
    for device in tainted["spec"]["devices"]:
        device["taints"] = [{"key": "xid", "value": "79", "effect": "NoExecute"}]
    tainted["metadata"]["resourceVersion"] = str(10**20 - 1)
    kept = [s for s in slices if s is not gpu_slices[0] and s is not gone_slice]
    records = [normalize("ResourceSlice", s) for s in [tainted, *kept]]
    ingest.replace_all(editor.cluster, "ResourceSlice", records, 10**20)
    assert_read_model_is_current(editor.cluster.pk)
    assert any(g.tainted for g in GpuState.objects.filter(pool=tainted["spec"]["pool"]["name"]))
