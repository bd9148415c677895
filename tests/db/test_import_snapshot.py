"""import_snapshot + fleet_summary on the fixtures give the counts the fixtures were built with."""

import json
from collections import defaultdict
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from fleet.models import (
    Device,
    DeviceAllocation,
    DeviceClass,
    Node,
    Pod,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
    SchedulingEvent,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EXPECTED = json.loads((FIXTURES / "EXPECTED.json").read_text())


@pytest.fixture
def imported():
    out = StringIO()
    call_command("import_snapshot", str(FIXTURES / "fleet-small.yaml"), cluster="fixtures", stdout=out)
    return out.getvalue()


def summary_json():
    out = StringIO()
    call_command("fleet_summary", "--cluster", "fixtures", "--json", stdout=out)
    return json.loads(out.getvalue())


def test_it_imports_every_object_of_the_fixture(imported):
    assert Node.objects.count() == EXPECTED["nodes"]
    assert ResourceSlice.objects.count() == EXPECTED["resource_slices"]
    assert DeviceClass.objects.count() == EXPECTED["device_classes"]
    assert ResourceClaimTemplate.objects.count() == EXPECTED["claim_templates"]
    assert ResourceClaim.objects.count() == EXPECTED["claims"]["total"]
    assert Pod.objects.count() == EXPECTED["pods"]["total"]
    assert SchedulingEvent.objects.count() == sum(EXPECTED["events"].values())
    assert "ResourceSlice: 16 written" in imported


def test_claim_states_match_the_fixture(imported):
    states = {}
    for state in ("pending", "allocated", "reserved"):
        states[state] = ResourceClaim.objects.filter(state=state).count()
    assert states["pending"] == EXPECTED["claims"]["pending"]
    assert states["reserved"] == EXPECTED["claims"]["allocated_reserved"]
    assert states["allocated"] == EXPECTED["claims"]["allocated_unreserved"]


def test_fleet_summary_counts_match_the_fixture(imported):
    summary = summary_json()
    # EXPECTED splits static and dynamic MIG; the summary groups by model/kind/profile.
    expected: dict = defaultdict(lambda: defaultdict(int))
    for key, counts in EXPECTED["devices"].items():
        family, kind = key.split("/")[:2]
        for state, n in counts.items():
            expected[(family, kind)][state] += n
    got: dict = defaultdict(lambda: defaultdict(int))
    for g in summary["groups"]:
        for state in ("total", "allocated", "unavailable", "tainted", "free"):
            got[(g["model"], g["kind"])][state] += g[state]
    for key, counts in expected.items():
        assert got[key]["total"] == counts["total"], key
        assert got[key]["allocated"] == counts["allocated"], key
        # The fixture's states ignore taints; the summary counts an idle tainted device as unavailable.
        assert got[key]["free"] + got[key]["unavailable"] == counts["free"] + counts["unavailable"], key
        assert got[key]["unavailable"] >= counts["unavailable"], key
    allocated = set(DeviceAllocation.objects.values_list("driver", "pool", "device_name"))
    tainted = Device.objects.filter(tainted=True).values_list("driver", "pool", "name")
    idle_tainted = [d for d in tainted if d not in allocated]
    extra = sum(got[key]["unavailable"] - counts["unavailable"] for key, counts in expected.items())
    assert extra == len(idle_tainted) > 0
    assert sum(g["tainted"] for g in summary["groups"]) == EXPECTED["tainted_devices"]


def test_mig_profiles_and_partition_aware_gpu_totals_match(imported):
    summary = summary_json()
    by_profile: dict = defaultdict(lambda: defaultdict(int))
    for key, counts in EXPECTED["mig_profiles"].items():
        family, profile, _ = key.split("/")
        for state, n in counts.items():
            by_profile[(family, profile)][state] += n
    for g in summary["groups"]:
        if g["kind"] == "mig":
            exp = by_profile[(g["model"], g["profile"])]
            assert (g["total"], g["allocated"], g["unavailable"]) == (
                exp["total"],
                exp["allocated"],
                exp["unavailable"],
            )
    models = {m["model"]: m for m in summary["models"]}
    assert {m: t["gpus"] for m, t in models.items()} == EXPECTED["physical_gpus"]
    for family, slices in EXPECTED["compute_slices"].items():
        assert models[family]["compute_slices"] == slices["total"]
        assert models[family]["compute_slices_allocated"] == slices["allocated"]


def test_mig_memory_is_never_added_to_its_gpu(imported):
    summary = summary_json()
    static_h200 = next(m for m in summary["models"] if m["model"] == "H200")
    # H200 nodes carry only MIG slices: 8 physical GPUs, however many slices they hold.
    assert static_h200["gpus"] == 8 and static_h200["gpus_mig"] == 8
    assert Device.objects.filter(model="H200", kind="mig").count() > 8


def test_an_edited_file_at_the_same_versions_is_reported_unchanged_until_replace(imported, tmp_path):
    # The version fence keeps an object stored at the same resourceVersion: the command says so instead
    # of seeming to import the edit, and --replace imports the file as it is.
    doc = yaml.safe_load((FIXTURES / "fleet-small.yaml").read_text())
    node = next(o for o in doc["items"] if o["kind"] == "Node")
    node["metadata"].setdefault("labels", {})["edited"] = "yes"
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump(doc))
    out = StringIO()
    call_command("import_snapshot", str(edited), cluster="fixtures", stdout=out)
    assert f"Node: 0 written, {EXPECTED['nodes']} unchanged" in out.getvalue()
    assert "pass --replace" in out.getvalue()
    assert "edited" not in Node.objects.get(name=node["metadata"]["name"]).labels
    out = StringIO()
    call_command("import_snapshot", str(edited), cluster="fixtures", replace=True, stdout=out)
    assert f"Node: {EXPECTED['nodes']} written" in out.getvalue() and "unchanged" not in out.getvalue()
    assert Node.objects.get(name=node["metadata"]["name"]).labels["edited"] == "yes"
    assert ResourceClaim.objects.count() == EXPECTED["claims"]["total"]  # everything else again


def test_a_malformed_object_is_reported_by_name_and_the_rest_imported(tmp_path):
    docs = list(yaml.safe_load_all((FIXTURES / "fleet-small.yaml").read_text()))
    items = [i for d in docs for i in d["items"] if i["kind"] == "Node"]
    items[0]["metadata"]["resourceVersion"] = "not-a-number"
    bad_name = items[0]["metadata"]["name"]
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    err = StringIO()
    with pytest.raises(CommandError, match="1 object"):
        call_command("import_snapshot", str(path), cluster="broken", stdout=StringIO(), stderr=err)
    assert bad_name in err.getvalue() and "metadata.resourceVersion" in err.getvalue()
    assert Node.objects.count() == len(items) - 1


def test_unreadable_files_give_a_clear_error(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(CommandError, match=r"nope\.yaml"):
        call_command("import_snapshot", str(missing), cluster="x")
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: [unclosed")
    with pytest.raises(CommandError, match="invalid YAML"):
        call_command("import_snapshot", str(broken), cluster="x")


def test_fleet_summary_names_an_unknown_cluster(imported):
    with pytest.raises(CommandError, match=r"no cluster named 'nope'.*fixtures"):
        call_command("fleet_summary", "--cluster", "nope")


HAND_WRITTEN = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.example.com}
spec:
  selectors: [{cel: {expression: "device.driver == 'gpu.example.com'"}}]
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: train, namespace: ml}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.example.com, count: %d}
"""


def test_hand_written_manifests_are_imported_and_an_edit_replaces_them(tmp_path):
    # What explain --fleet and kubectl apply take (no uid, no resourceVersion) imports too.
    path = tmp_path / "hand.yaml"
    path.write_text(HAND_WRITTEN % 1)
    out = StringIO()
    call_command("import_snapshot", str(path), cluster="hand", stdout=out)
    assert "ResourceClaim: 1 written" in out.getvalue()
    assert "2 hand-written object(s)" in out.getvalue()
    claim = ResourceClaim.objects.get(cluster__name="hand", namespace="ml", name="train")
    assert claim.requests[0]["count"] == 1
    path.write_text(HAND_WRITTEN % 2)
    call_command("import_snapshot", str(path), cluster="hand", stdout=StringIO())
    edited = ResourceClaim.objects.get(cluster__name="hand", namespace="ml", name="train")
    assert edited.uid == claim.uid and edited.requests[0]["count"] == 2


def test_after_an_import_with_replace_every_pending_claim_is_diagnosed(
    imported, monkeypatch, django_capture_on_commit_callbacks
):
    # Tasks run where they are queued (as in make demo): the first batch's debounced recompute used to
    # run before the claims were written, and the later batches' requests fell in its window.
    from claims import tasks

    def run_now(args, countdown=0):
        return tasks.update_diagnoses(*args)

    monkeypatch.setattr(tasks.update_diagnoses, "apply_async", run_now)
    monkeypatch.setattr(tasks, "_local_marks", {})
    monkeypatch.setattr(tasks.settings, "REDIS_URL", None)  # the in-process debounce, as in make demo
    with django_capture_on_commit_callbacks(execute=True):
        fixture = str(FIXTURES / "fleet-small.yaml")
        call_command("import_snapshot", fixture, cluster="fixtures", replace=True, stdout=StringIO())
    pending = ResourceClaim.objects.filter(cluster__name="fixtures", state="pending")
    assert pending.exists()
    assert not pending.filter(diagnosis__isnull=True).exists()
