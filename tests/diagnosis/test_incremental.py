"""The incremental diagnosis holds exactly what a full recompute computes.

Random streams of fleet changes (devices added and removed, taints, allocations made and freed, pending
claims created, allocated and deleted, pods, classes) go through ingest into PostgreSQL, as watch batches
or as relists of their kinds; after each step
``update_diagnoses`` applies the logged change events to the worker's in-memory fleet and re-diagnoses the
claims they reached; what it stored must equal, byte for byte, the diagnosis of every pending claim on a
fleet freshly loaded from the database; at the end the full recompute must find nothing to change.

Each run draws a new seed and prints it; a failing seed is appended to ``incremental_seeds.txt`` and runs
in every later run.
"""

from __future__ import annotations

import collections
import copy
import gc
import json
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection, connections

from claims import changelog, livestate, tasks
from claims.diagnosis import diagnose
from claims.diagnosis.footprint import Footprint
from claims.fleetstate import FleetState
from claims.models import ClaimDiagnosis, DiagnosisShape
from fleet import ingest
from fleet.models import Cluster, ResourceClaim
from fleet.normalize import normalize
from simulator import nvidia
from tests import seeds

# Real commits: change events are published after each commit, as in production.
pytestmark = pytest.mark.django_db(transaction=True)
SEEDS = Path(__file__).with_name("incremental_seeds.txt")
STEPS = 30
RELISTED = 0.15  # of the writes go in as a relist
Obj = dict[str, Any]
GPU = "device.attributes['gpu.nvidia.com']"
SPREAD = "0/3 nodes are available: 3 node(s) didn't match pod topology spread constraints."


def key(obj: Obj) -> tuple[str, str, str]:
    meta = obj["metadata"]
    return obj["kind"], meta.get("namespace", ""), meta["name"]


class Fleet:
    """The objects of one simulated cluster, changed at random and written through ingest."""

    def __init__(self, rng: random.Random, cluster: Cluster) -> None:
        self.rng, self.cluster = rng, cluster
        self.version = 1000
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.nodes: dict[
            str, tuple[str, str, int, dict[int, list[Obj]]]
        ] = {}  # name -> model, mode, gpus, taints
        self.serial = 0
        # Whether a write goes in as a relist of each kind it touches (a watch restarted), drawn from a
        # generator of its own: the kept seeds' streams of changes stay what they were.
        self.relists = random.Random(f"relists of {cluster.name}")
        self.relist_share, self.relist_keys = RELISTED, [0, 1, 2000]

    # -- writing

    def write(self, upserts: list[Obj], deletes: list[Obj] = ()) -> None:  # type: ignore[assignment]
        by_kind: dict[str, list[ingest.Change]] = {}
        for obj in upserts:
            self.version += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.version)
            obj["metadata"].setdefault("uid", f"uid-{obj['kind']}-{obj['metadata']['name']}")
            self.objects[key(obj)] = obj
            by_kind.setdefault(obj["kind"], []).append(ingest.Change("upsert", normalize(obj["kind"], obj)))
        for obj in deletes:
            self.version += 1
            gone = copy.deepcopy(self.objects.pop(key(obj)))
            gone["metadata"]["resourceVersion"] = str(self.version)
            by_kind.setdefault(obj["kind"], []).append(ingest.Change("delete", normalize(obj["kind"], gone)))
        for kind in ("DeviceClass", "Node", "ResourceSlice", "DeviceTaintRule", "ResourceClaim", "Pod"):
            if kind not in by_kind:
                continue
            if self.relists.random() < self.relist_share:
                # Its event names the keys it changed, or counts them only when there are more than
                # RELIST_KEYS (0 or 1 here, at times): the diagnosis then reads the kind again whole.
                ingest.events.RELIST_KEYS = self.relists.choice(self.relist_keys)
                listed = [normalize(kind, o) for o in self.of(kind)]
                ingest.replace_all(self.cluster, kind, listed, list_resource_version=self.version)
            else:
                ingest.apply_batch(self.cluster, kind, by_kind[kind])

    def of(self, kind: str) -> list[Obj]:
        return [o for k, o in sorted(self.objects.items()) if k[0] == kind]

    # -- building blocks

    def slices(self, node: str) -> list[Obj]:
        model, mode, gpus, taints = self.nodes[node]
        out = []
        for s in nvidia.node_slices(node, model, mode=mode, gpus=gpus, taints=taints):
            s["kind"] = "ResourceSlice"
            out.append(s)
        return out

    def set_node(self, node: str, model: str, mode: str, gpus: int, taints: dict[int, list[Obj]]) -> None:
        old = [o for o in self.of("ResourceSlice") if o["spec"]["pool"]["name"] == node]
        self.nodes[node] = (model, mode, gpus, taints)
        new = self.slices(node) if gpus else []
        names = {s["metadata"]["name"] for s in new}
        upserts = new
        if key({"kind": "Node", "metadata": {"name": node}}) not in self.objects:
            upserts = [{**nvidia.node_object(node, model, gpus=max(gpus, 1)), "kind": "Node"}, *new]
        self.write(upserts, [s for s in old if s["metadata"]["name"] not in names])

    def devices(self) -> list[tuple[str, str]]:
        """(pool, device) of every published device."""
        return [
            (s["spec"]["pool"]["name"], d["name"])
            for s in self.of("ResourceSlice")
            for d in s["spec"].get("devices", [])
        ]

    def held(self) -> set[tuple[str, str]]:
        out = set()
        for c in self.of("ResourceClaim"):
            for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", []):
                out.add((r["pool"], r["device"]))
        return out

    def pending(self) -> list[Obj]:
        return [c for c in self.of("ResourceClaim") if not (c.get("status") or {}).get("allocation")]

    def request(self) -> Obj:
        rng = self.rng
        shape = rng.randrange(7)
        if shape == 0:
            return nvidia.exactly_request("gpu", "gpu.nvidia.com", rng.randint(1, 3))
        if shape == 1:
            model = rng.choice(["H100", "A100", "B200"])
            return nvidia.exactly_request(
                "gpu", "gpu.nvidia.com", 1, selectors=[f"{GPU}.productName.string().contains('{model}')"]
            )
        if shape == 2:
            return nvidia.exactly_request("mig", "mig.nvidia.com", rng.randint(1, 2))
        if shape == 3:
            return nvidia.exactly_request(
                "mig",
                "mig.nvidia.com",
                1,
                selectors=[f"{GPU}.profile == '{rng.choice(['1g.10gb', '3g.40gb'])}'"],
            )
        if shape == 4:
            return nvidia.exactly_request("gpu", "gpu.nvidia.com", 1, tolerations=[{"operator": "Exists"}])
        if shape == 5:
            return nvidia.exactly_request("gpu", "no-such-class.example.com", 1)
        return nvidia.exactly_request("gpu", "gpu.nvidia.com", 1, selectors=[f"{GPU}.noSuchAttribute == 'x'"])

    def new_name(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}-{self.serial}"

    def created(self) -> str:
        return f"2026-01-01T{self.serial // 60 % 24:02d}:{self.serial % 60:02d}:00Z"

    # -- changes

    def change(self) -> str:
        rng = self.rng
        moves = [
            self.allocate,
            self.allocate,
            self.free,
            self.free,
            self.add_pending,
            self.add_pending,
            self.drop_pending,
            self.allocate_pending,
            self.taint,
            self.resize,
            self.add_node,
            self.pod,
            self.class_change,
            self.other_slice_only,
            self.taint_rule,
        ]
        move = rng.choice(moves)
        return move() or move.__name__

    def allocate(self) -> str | None:
        free = sorted(set(self.devices()) - self.held())
        if not free:
            return "allocate: nothing free"
        picked = self.rng.sample(free, min(len(free), self.rng.randint(1, 2)))
        pool = picked[0][0]
        picked = [p for p in picked if p[0] == pool]
        name = self.new_name("held")
        results = [{"request": "gpu", "device": d} for _, d in picked]
        reserved = (
            [{"resource": "pods", "name": f"pod-{name}", "uid": f"uid-{name}"}]
            if self.rng.random() < 0.7
            else []
        )
        claim = nvidia.claim_object(
            "team",
            name,
            [nvidia.exactly_request("gpu", "gpu.nvidia.com", len(picked))],
            status=nvidia.allocation_status(results, pool, reserved),
            created=self.created(),
        )
        self.write([{**claim, "kind": "ResourceClaim"}])
        return None

    def free(self) -> str | None:
        held = [c for c in self.of("ResourceClaim") if (c.get("status") or {}).get("allocation")]
        if not held:
            return "free: nothing held"
        self.write([], [self.rng.choice(held)])
        return None

    def add_pending(self) -> None:
        requests = [self.request() for _ in range(self.rng.choice([1, 1, 2]))]
        for i, r in enumerate(requests):
            r["name"] = f"r{i}"
        name = self.new_name("want")
        # Half look made from a pod's template: owner, annotation and labels, which claims of one shape
        # do not share and the diagnosis does not read.
        owned = self.rng.random() < 0.5
        owner = {"metadata": {"name": f"pod-of-{name}", "uid": f"uid-pod-of-{name}"}}
        claim = nvidia.claim_object(
            "team",
            name,
            requests,
            created=self.created(),
            owner_pod=owner if owned else None,
            pod_claim_name="c" if owned else None,
            labels={"job": name} if owned else None,
        )
        self.write([{**claim, "kind": "ResourceClaim"}])

    def drop_pending(self) -> str | None:
        pending = self.pending()
        if not pending:
            return "drop_pending: none"
        self.write([], [self.rng.choice(pending)])
        return None

    def allocate_pending(self) -> str | None:
        pending = self.pending()
        free = sorted(set(self.devices()) - self.held())
        if not pending or not free:
            return "allocate_pending: none"
        claim = copy.deepcopy(self.rng.choice(pending))
        pool, device = free[0]
        claim["status"] = nvidia.allocation_status([{"request": "r0", "device": device}], pool, [])
        self.write([claim])
        return None

    def taint(self) -> None:
        node = self.rng.choice(sorted(self.nodes))
        model, mode, gpus, taints = self.nodes[node]
        taints = dict(taints)
        gpu = self.rng.randrange(max(gpus, 1))
        if taints.get(gpu):
            del taints[gpu]
        else:
            taints[gpu] = [{"key": "nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
        self.set_node(node, model, mode, gpus, taints)

    def resize(self) -> None:
        node = self.rng.choice(sorted(self.nodes))
        model, mode, gpus, taints = self.nodes[node]
        gpus = max(0, min(4, gpus + self.rng.choice([-1, 1])))
        self.set_node(node, model, mode, gpus, {k: v for k, v in taints.items() if k < gpus})

    def add_node(self) -> None:
        model, mode = self.rng.choice([("H100", "full"), ("A100", "static-mig"), ("B200", "dynamic-mig")])
        self.set_node(self.new_name("node"), model, mode, self.rng.randint(1, 2), {})

    def pod(self) -> str | None:
        pending = self.pending()
        if not pending:
            return "pod: no pending claim"
        claim = self.rng.choice(pending)["metadata"]["name"]
        name = f"pod-of-{claim}"
        node = self.rng.choice([None, *sorted(self.nodes)])
        # The scheduler's message, read by the diagnosis: none, a DRA one, or another reason.
        message = self.rng.choice([None, "0/3 nodes are available: cannot allocate all claims.", SPREAD])
        created = self.created()
        pod = nvidia.pod_object(
            "team",
            name,
            [("c", nvidia.from_claim(claim))],
            created=created,
            scheduled=nvidia.unschedulable_condition(message, created) if message else None,
            labels={"serial": str(self.serial)},
        )
        if node:
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
        existing = self.objects.get(("Pod", "team", name))
        if existing is not None and self.rng.random() < 0.5:
            self.write([], [existing])
        else:
            self.write([{**pod, "kind": "Pod"}])
        return None

    def class_change(self) -> None:
        extra = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "no-such-class.example.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]},
        }
        existing = self.objects.get(key(extra))
        if existing is not None:
            self.write([], [existing])
        else:
            self.write([extra])

    def taint_rule(self) -> None:
        """A DeviceTaintRule on one node's pool added (NoSchedule or NoExecute), or one removed."""
        rules = self.of("DeviceTaintRule")
        if rules and self.rng.random() < 0.4:
            self.write([], [self.rng.choice(rules)])
            return
        node = self.rng.choice(sorted(self.nodes))
        effect = self.rng.choice(["NoSchedule", "NoExecute"])
        rule = nvidia.device_taint_rule(
            self.new_name("rule"), {"key": "maintenance", "value": "on", "effect": effect}, pool=node
        )
        self.write([rule])

    def other_slice_only(self) -> None:
        """A slice rewritten with nothing changed but its resourceVersion (a driver's resync)."""
        node = self.rng.choice(sorted(self.nodes))
        self.write([s for s in self.of("ResourceSlice") if s["spec"]["pool"]["name"] == node][:1])


def stored(cluster: str) -> dict[tuple[str, str], str]:
    rows = ClaimDiagnosis.objects.filter(claim__cluster__name=cluster).select_related("claim", "shape")
    return {
        (d.claim.namespace, d.claim.name): json.dumps([d.category, d.summary, d.result], sort_keys=True)
        for d in rows
    }


def fresh(cluster: str) -> dict[tuple[str, str], str]:
    """Every pending claim diagnosed on a fleet loaded from the database now, as the stored JSON. Each
    on a state of its own: nothing one diagnosis caches on a state can then leak into another's."""
    out = {}
    for claim in ResourceClaim.objects.filter(cluster__name=cluster, state="pending"):
        state = FleetState.from_db(cluster, lean=True)
        result = json.loads(json.dumps(diagnose(state, {**claim.raw, "kind": "ResourceClaim"}).as_dict()))
        out[(claim.namespace, claim.name)] = json.dumps(
            [result["category"], result["summary"], result], sort_keys=True
        )
    return out


@pytest.fixture
def quiet(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Change events reach the change log at once (as after each commit); no task goes to the broker: the
    test calls ``update_diagnoses`` itself, as the worker would."""
    if connection.vendor != "postgresql":
        pytest.fail(f"the incremental diagnosis test needs PostgreSQL, got {connection.vendor}")
    monkeypatch.setattr(tasks.update_diagnoses, "apply_async", lambda *a, **kw: None)
    monkeypatch.setattr(tasks, "notify_pending_changed", lambda cluster: None)
    monkeypatch.setattr(tasks, "PREPARE_ABOVE", tasks.PREPARE_ABOVE)  # run_stream picks its own
    monkeypatch.setattr(ingest.events, "RELIST_KEYS", ingest.events.RELIST_KEYS)  # and Fleet.write
    tasks.forget()
    yield
    tasks.forget()


def new_fleet(name: str, rng: random.Random) -> Fleet:
    """An empty cluster ``name`` with the NVIDIA device classes and an empty change log."""
    redis.Redis.from_url(str(settings.REDIS_URL)).delete(*changelog._keys(name))
    fleet = Fleet(rng, ingest.get_or_create_cluster(name))
    fleet.write([{**c, "kind": "DeviceClass"} for c in nvidia.device_classes()])
    return fleet


def assert_links_current(live: Any, loaded: FleetState, where: str) -> None:
    """The live fleet's pods by claim and holders by device are those of a fleet loaded now, in the same
    order, and hold the live fleet's current objects."""
    from claims.allocator.baseline import from_nothing
    from claims.fleetstate import HoldersByAge, holders_by_device, pods_by_claim
    from claims.livestate import READ, key_of

    for kind, live_index, fresh_index in (
        ("Pod", live.pods_by_claim, pods_by_claim(loaded.objects["Pod"])),
        ("ResourceClaim", live.holders, holders_by_device(loaded.objects["ResourceClaim"])),
    ):
        keys = {k: [key_of(o) for o in v] for k, v in live_index.items()}
        assert keys == {k: [key_of(o) for o in v] for k, v in fresh_index.items()}, f"{where}: {kind}"
        table = live.objects[kind]
        assert all(o is table[key_of(o)] for v in live_index.values() for o in v), f"{where}: {kind}"
    # Each kind's ordered list (kept in place across changes) is its objects sorted by name, then
    # namespace, as a fresh sort puts them.
    for kind in READ:
        ordered = live._ordered_list(kind)
        want = [live.objects[kind][(ns, name)] for name, ns in sorted((n, s) for s, n in live.objects[kind])]
        assert len(ordered) == len(want), f"{where}: {kind}"
        assert all(a is b for a, b in zip(ordered, want, strict=True)), f"{where}: {kind}"
        assert live._sort_keys[kind] == [(key_of(o)[1], key_of(o)[0]) for o in ordered], f"{where}: {kind}"
    # The holders in age order, kept claim by claim, are those a fleet loaded now sorts, as objects of
    # the live fleet.
    fresh = HoldersByAge.of(loaded.holders())
    kept_order = live.by_age.snapshot()
    for kept_list, fresh_list in ((kept_order.every, fresh.every), (kept_order.unreserved, fresh.unreserved)):
        assert [key_of(o) for o in kept_list] == [key_of(o) for o in fresh_list], f"{where}: by age"
        assert all(o is live.objects["ResourceClaim"][key_of(o)] for o in kept_list), f"{where}: by age"
    # The allocator's baseline kept between states is the one the fleet loaded now sums up, and the
    # allocated claims kept claim by claim are the loaded fleet's, as the live fleet's objects.
    with live.state() as state:
        kept = live.allocated.baseline(state.snapshot)
        allocated = state.snapshot.allocated_claims
        assert sorted(map(key_of, allocated)) == sorted(map(key_of, loaded.snapshot.allocated_claims)), where
        assert all(o is live.objects["ResourceClaim"][key_of(o)] for o in allocated), where
    summed = from_nothing(loaded.snapshot)
    assert (kept.in_use, kept.shared) == (summed.in_use, summed.shared), f"{where}: devices in use"
    assert (kept.counter_use, kept.capacity_use) == (summed.counter_use, summed.capacity_use), where


def run_stream(seed: int) -> None:
    rng = random.Random(seed)
    name = f"incr-{seed % 1_000_000}"
    fleet = new_fleet(name, rng)
    fleet.set_node("h1", "H100", "full", 2, {})
    fleet.set_node("a1", "A100", "static-mig", 1, {})
    fleet.set_node("b1", "B200", "dynamic-mig", 1, {})
    for _ in range(3):
        fleet.allocate()
    for _ in range(6):
        fleet.add_pending()
    # Updates with the fleet's indexes built up front (as on a large change) or lazily: alike.
    tasks.PREPARE_ABOVE = rng.choice([0, 3, 1000])
    tasks.update_diagnoses(name)  # the first update of a process: the full recompute
    done: list[str] = []
    for step in range(STEPS):
        for _ in range(rng.choice([1, 1, 2, 3])):
            done.append(fleet.change())
        counts = tasks.update_diagnoses(name)
        assert "full" not in counts, f"seed {seed} step {step}: the update fell back to a full recompute"
        expected, held = fresh(name), stored(name)
        # What the next update compares against is this fleet's footprint, not an older one's.
        footprint = tasks._live[name].footprint
        loaded = FleetState.from_db(name, lean=True)
        assert footprint == Footprint.of(loaded), f"seed {seed} step {step}"
        assert_links_current(tasks._live[name].fleet, loaded, f"seed {seed} step {step}")
        unused = DiagnosisShape.objects.filter(cluster__name=name, claimdiagnosis__isnull=True)
        assert not unused.exists(), f"seed {seed} step {step}: shapes no claim reads were kept"
        if held != expected:
            wrong = sorted(k for k in expected.keys() | held.keys() if held.get(k) != expected.get(k))
            raise AssertionError(
                f"seed {seed} step {step} after {done[-3:]}: incremental differs for {wrong[:5]}:\n"
                f"held     {held.get(wrong[0], '')[:600]}\nexpected {expected.get(wrong[0], '')[:600]}"
            )
    before = stored(name)
    tasks.recompute_diagnoses(name)
    assert stored(name) == before, f"seed {seed}: the full recompute changed what the incremental path held"


NEW_SEED = random.SystemRandom().randrange(2**32)


@pytest.mark.parametrize("seed", [NEW_SEED, *seeds.kept(SEEDS)])
def test_incremental_diagnoses_equal_a_full_recompute_on_random_change_streams(
    seed: int, quiet: None
) -> None:
    print(f"incremental diagnosis seed: {seed}")
    with seeds.keeping(SEEDS, seed):
        run_stream(seed)


def test_an_update_trusts_what_it_stored_but_rewrites_a_row_deleted_behind_its_back(quiet: None) -> None:
    from django.test.utils import CaptureQueriesContext

    name = "incr-digest"
    fleet = new_fleet(name, random.Random(11))
    fleet.set_node("h1", "H100", "full", 2, {})
    for _ in range(3):
        fleet.add_pending()
    tasks.update_diagnoses(name)  # the full recompute
    assert stored(name) == fresh(name) and len(stored(name)) == 3
    victim, other, _ = fleet.pending()
    ClaimDiagnosis.objects.filter(claim__cluster__name=name, claim__name=victim["metadata"]["name"]).delete()
    # Both claims are reached (their objects change), neither diagnosis differs: only the deleted row is
    # written, and no stored result is read back (the process compares digests of what it wrote).
    touched = [copy.deepcopy(c) for c in (victim, other)]
    for claim in touched:
        claim["metadata"].setdefault("annotations", {})["team.example.com/touched"] = "yes"
    fleet.write(touched)
    with CaptureQueriesContext(connection) as queries:
        counts = tasks.update_diagnoses(name)
    assert counts["diagnosed"] == 2 and counts["written"] == 1, counts
    assert not [
        q["sql"] for q in queries if '"result"' in q["sql"] and q["sql"].lstrip().startswith("SELECT")
    ]
    assert stored(name) == fresh(name) and len(stored(name)) == 3


def test_claims_of_one_shape_share_one_stored_row_which_an_update_rewrites_alone(quiet: None) -> None:
    from django.test.utils import CaptureQueriesContext

    name = "incr-one-row"
    fleet = new_fleet(name, random.Random(3))
    fleet.set_node("h1", "H100", "full", 2, {})
    for i in range(4):  # alike but for their names
        claim = nvidia.claim_object(
            "team", f"alike-{i}", [nvidia.exactly_request("gpu", "gpu.nvidia.com", 4)]
        )
        fleet.write([{**claim, "kind": "ResourceClaim"}])
    tasks.update_diagnoses(name)  # the full recompute
    assert DiagnosisShape.objects.filter(cluster__name=name).count() == 1
    assert stored(name) == fresh(name) and len(stored(name)) == 4
    links = list(
        ClaimDiagnosis.objects.filter(claim__cluster__name=name).order_by("pk").values_list("pk", "shape_id")
    )
    fleet.set_node("h1", "H100", "full", 3, {})  # every claim's counts change
    with CaptureQueriesContext(connection) as queries:
        counts = tasks.update_diagnoses(name)
    assert counts["diagnosed"] == 4 and counts["written"] == 4, counts
    writes = [q["sql"] for q in queries if q["sql"].lstrip().startswith(("INSERT", "UPDATE"))]
    assert not [w for w in writes if '"claims_claimdiagnosis"' in w]
    assert len([w for w in writes if '"claims_diagnosisshape"' in w]) == 1
    assert (
        list(
            ClaimDiagnosis.objects.filter(claim__cluster__name=name)
            .order_by("pk")
            .values_list("pk", "shape_id")
        )
        == links
    )
    assert stored(name) == fresh(name)
    # A claim joining the unchanged shape shows it computed on the state that found the claim.
    claim = nvidia.claim_object("team", "alike-4", [nvidia.exactly_request("gpu", "gpu.nvidia.com", 4)])
    fleet.write([{**claim, "kind": "ResourceClaim"}])
    tasks.update_diagnoses(name, now="2031-01-01T00:00:00+00:00")
    joined = ClaimDiagnosis.objects.select_related("shape").get(
        claim__cluster__name=name, claim__name="alike-4"
    )
    assert joined.shape_id == links[0][1] and joined.computed_at.year == 2031
    # Once no claim reads it, the shape goes (the claims' rows went with the claims).
    fleet.write([], fleet.pending())
    tasks.update_diagnoses(name)
    assert not ClaimDiagnosis.objects.filter(claim__cluster__name=name).exists()
    assert not DiagnosisShape.objects.filter(cluster__name=name).exists()


def test_an_update_reads_again_only_the_pending_claims_that_changed(quiet: None) -> None:
    from django.test.utils import CaptureQueriesContext

    name = "incr-rows"
    fleet = new_fleet(name, random.Random(6))
    fleet.set_node("h1", "H100", "full", 2, {})
    for i in range(3):
        claim = nvidia.claim_object("team", f"want-{i}", [nvidia.exactly_request("gpu", "gpu.nvidia.com", 4)])
        fleet.write([{**claim, "kind": "ResourceClaim"}])
    tasks.update_diagnoses(name)  # the full recompute
    kept = dict(tasks._live[name].claims)
    changed = copy.deepcopy(fleet.objects[("ResourceClaim", "team", "want-1")])
    changed["spec"]["devices"]["requests"][0]["exactly"]["count"] = 5
    fleet.write([changed])
    fleet.set_node("h1", "H100", "full", 3, {})  # every claim's counts change
    with CaptureQueriesContext(connection) as queries:
        counts = tasks.update_diagnoses(name)
    assert counts["diagnosed"] == 3, counts
    reads = [q["sql"] for q in queries if q["sql"].startswith("SELECT") and '"raw"' in q["sql"]]
    assert len(reads) == 1 and '"claims_resourceclaim"' in reads[0], reads
    now = tasks._live[name].claims
    want = {c.name: pk for pk, c in kept.items()}
    assert now[want["want-0"]] is kept[want["want-0"]] and now[want["want-2"]] is kept[want["want-2"]]
    assert now[want["want-1"]] is not kept[want["want-1"]]
    assert now[want["want-1"]].raw["spec"]["devices"]["requests"][0]["exactly"]["count"] == 5
    assert stored(name) == fresh(name)
    # A claim deleted meanwhile leaves the rows kept.
    fleet.write([], [fleet.objects[("ResourceClaim", "team", "want-0")]])
    tasks.update_diagnoses(name)
    assert set(tasks._live[name].claims) == {want["want-1"], want["want-2"]}


@pytest.mark.parametrize("redis_url", ["", "redis://127.0.0.1:1/0"])
def test_without_redis_one_thread_at_a_time_updates_a_cluster(
    monkeypatch: pytest.MonkeyPatch, settings: Any, redis_url: str
) -> None:
    # The demo runs the tasks in each ingest thread, with no Redis lock between them: two must never
    # change one cluster's fleet at once. With Redis, that lock does it (and a run finding it held returns
    # at once): the process lock stays out of the way, so two runs here overlap.
    settings.REDIS_URL = redis_url
    running, most = [0], [0]

    def update(cluster: str, now: str | None) -> dict[str, int]:
        running[0] += 1
        most[0] = max(most[0], running[0])
        time.sleep(0.2)
        running[0] -= 1
        return {}

    monkeypatch.setattr(tasks, "_update", update)
    threads = [threading.Thread(target=tasks.update_diagnoses, args=["demo"]) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert most[0] == (1 if not redis_url else 3)


@pytest.mark.parametrize(("relist_keys", "diagnosed"), [(2000, 2), (0, 4)])
def test_a_relist_naming_its_keys_rediagnoses_only_the_claims_it_reached(
    quiet: None, relist_keys: int, diagnosed: int
) -> None:
    # A watch restarted: the relist of the slices finds one node grown. Named, its keys reach the pool of
    # that node, read by the GPU claims only; counted only, they reach every pending claim.
    name = f"incr-relist-{relist_keys}"
    fleet = new_fleet(name, random.Random(5))
    fleet.set_node("h1", "H100", "full", 2, {})
    fleet.set_node("a1", "A100", "static-mig", 1, {})
    for i, request in enumerate(
        [nvidia.exactly_request("gpu", "gpu.nvidia.com", n) for n in (3, 4)]
        + [nvidia.exactly_request("mig", "mig.nvidia.com", n) for n in (8, 9)]
    ):
        claim = nvidia.claim_object("team", f"want-{i}", [request])
        fleet.write([{**claim, "kind": "ResourceClaim"}])
    tasks.update_diagnoses(name)  # the full recompute
    fleet.relist_share, fleet.relist_keys = 1.0, [relist_keys]
    fleet.set_node("h1", "H100", "full", 3, {})
    counts = tasks.update_diagnoses(name)
    assert "full" not in counts and counts["diagnosed"] == diagnosed, counts
    assert stored(name) == fresh(name) and len(stored(name)) == 4


def test_the_update_after_a_load_reads_whole_only_the_kinds_relisted_after_the_load_read_them(
    quiet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An initial sync relists every kind while the first load runs (minutes at XL). A relist that
    # committed before the load read its kind is in the fleet already; one that committed after must
    # still be applied.
    from claims.livestate import LiveFleet

    name = "incr-load-relists"
    fleet = new_fleet(name, random.Random(7))
    fleet.set_node("h1", "H100", "full", 2, {})
    for i, n in enumerate((3, 4)):
        claim = nvidia.claim_object("team", f"want-{i}", [nvidia.exactly_request("gpu", "gpu.nvidia.com", n)])
        fleet.write([{**claim, "kind": "ResourceClaim"}])
    fleet.relist_share, fleet.relist_keys = 1.0, [0]  # every write a relist that only counts its keys
    reloads: list[str] = []
    original = LiveFleet._reload

    late = nvidia.claim_object("team", "want-late", [nvidia.exactly_request("gpu", "gpu.nvidia.com", 5)])

    def relisting_meanwhile(live: LiveFleet, kind: str) -> None:
        reloads.append(kind)
        original(live, kind)
        if kind == "ResourceSlice":  # after the load read the slices: a slices relist it missed
            fleet.set_node("h1", "H100", "full", 4, {})
        elif kind == "Node":  # before it takes the log's number for the claims: a claims relist it sees
            fleet.write([{**late, "kind": "ResourceClaim"}])

    monkeypatch.setattr(LiveFleet, "_reload", relisting_meanwhile)
    assert tasks.update_diagnoses(name)["full"] == 1  # the load, with both relists logged meanwhile
    assert reloads == list(livestate.READ)
    reloads.clear()
    counts = tasks.update_diagnoses(name)
    assert reloads == ["ResourceSlice"], reloads  # not the claims, which the load read after their relist
    assert "full" not in counts and counts["diagnosed"] == 3, counts
    assert stored(name) == fresh(name) and len(stored(name)) == 3


def test_an_update_whose_write_deadlocks_with_a_claim_writer_writes_again(
    quiet: None, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The deadlock of the watch worker's claim upserts with the diagnosis write, made on purpose: another
    # transaction locks claim b, the update's commit locks claim a for its foreign-key check and waits
    # for b, and the other transaction then asks for a. PostgreSQL aborts the update (the first waiter).
    name = "incr-deadlock"
    fleet = new_fleet(name, random.Random(4))
    fleet.set_node("h1", "H100", "full", 2, {})
    tasks.update_diagnoses(name)  # the full recompute
    for claim_name in ("a", "b"):
        claim = nvidia.claim_object("team", claim_name, [nvidia.exactly_request("gpu", "gpu.nvidia.com", 4)])
        fleet.write([{**claim, "kind": "ResourceClaim"}])
    a, b = ResourceClaim.objects.filter(cluster__name=name).order_by("id").values_list("id", flat=True)
    table = ResourceClaim._meta.db_table
    locked, failures = threading.Event(), []

    def other_writer() -> None:
        other = connections.create_connection("default")
        try:
            other.set_autocommit(False)
            with other.cursor() as cursor:
                cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [b])
                locked.set()
                deadline = time.monotonic() + 30
                waiting = 0
                while not waiting and time.monotonic() < deadline:
                    time.sleep(0.05)
                    cursor.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND pid <> pg_backend_pid() AND datname = current_database()"
                    )
                    waiting = cursor.fetchone()[0]
                cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [a])
            other.commit()
        except Exception as exc:  # the other writer aborted instead: the test fails below
            failures.append(exc)
        finally:
            other.close()

    thread = threading.Thread(target=other_writer)
    thread.start()
    assert locked.wait(30)
    pauses: list[float] = []
    monkeypatch.setattr(tasks, "_pause", lambda seconds: pauses.append(seconds))
    with caplog.at_level("WARNING", logger="claims.tasks"):
        counts = tasks.update_diagnoses(name)
    thread.join(60)
    assert not failures, failures
    assert "a deadlock aborted the write (try 1)" in caplog.text
    # It paused a moment before writing again (around DEADLOCK_PAUSE).
    assert len(pauses) == 1 and 0.5 * tasks.DEADLOCK_PAUSE <= pauses[0] <= 1.5 * tasks.DEADLOCK_PAUSE
    assert "full" not in counts and counts["written"] == 2, counts
    assert stored(name) == fresh(name) and len(stored(name)) == 2


def test_an_update_leaves_no_reference_cycles_of_its_own(quiet: None) -> None:
    # The diagnosis worker freezes what an update leaves (gc.freeze, claims.tasks._update): garbage in a
    # reference cycle would then stay until the next full recompute. Cycles seen before: a cached CEL error
    # whose traceback held every frame of the update, and each stored row cached both ways with its claim.
    name = "incr-cycles"
    fleet = new_fleet(name, random.Random(5))
    fleet.set_node("h1", "H100", "full", 4, {})
    fleet.set_node("b1", "B200", "dynamic-mig", 2, {})
    for _ in range(4):
        fleet.allocate()
    for _ in range(8):
        fleet.add_pending()
    # A selector that fails at runtime on some devices: its error is cached and raised again.
    bad = nvidia.claim_object(
        "team",
        "runtime-error",
        [
            {
                "name": "r0",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "selectors": [{"cel": {"expression": f"{GPU}.profile == '1g.10gb'"}}],
                },
            }
        ],
    )
    fleet.write([{**bad, "kind": "ResourceClaim"}])
    tasks.update_diagnoses(name)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(6):
            for _ in range(2):
                fleet.change()
            tasks.update_diagnoses(name)
        gc.collect()
        ours = [
            o
            for o in gc.garbage
            if type(o).__module__.split(".")[0] in ("claims", "fleet")
            or (type(o).__name__ == "frame" and "/claims/" in o.f_code.co_filename)
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not ours, collections.Counter(type(o).__qualname__ for o in ours).most_common(10)
    assert "runtime error" in json.dumps(list(stored(name).values())).lower()


def test_between_updates_the_process_keeps_the_fleet_and_a_footprint_but_no_state(
    quiet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A state's indexes and per-fleet context (holders, counters, the allocator's index: ~200 MB at XL)
    # would otherwise live until the next update and overlap the next state's at its peak.
    import weakref

    from claims.livestate import LiveFleet

    made: list[weakref.ref[FleetState]] = []
    original = LiveFleet.state

    def spy(self: LiveFleet) -> FleetState:
        state = original(self)
        made.append(weakref.ref(state))
        return state

    monkeypatch.setattr(LiveFleet, "state", spy)
    name = "incr-released"
    fleet = new_fleet(name, random.Random(3))
    fleet.set_node("h1", "H100", "full", 2, {})
    fleet.set_node("b1", "B200", "dynamic-mig", 1, {})
    fleet.allocate()
    for _ in range(3):
        fleet.add_pending()
    gc.disable()  # freed by reference counting, not by a collection
    try:
        assert tasks.update_diagnoses(name)["full"] == 1
        for _ in range(4):
            fleet.change()
            assert "full" not in tasks.update_diagnoses(name)
        assert len(made) >= 3 and [ref() for ref in made] == [None] * len(made)
    finally:
        gc.enable()
    live = tasks._live[name]
    assert isinstance(live.footprint, Footprint) and live.footprint.pools
    assert stored(name) == fresh(name)


def test_each_update_compares_against_the_fleet_the_last_update_left(quiet: None) -> None:
    # A node changes mode and back: A100 MIG slices -> whole H100s -> A100 MIG slices. The second change
    # reaches the pending 3-GPU claim only through what the pool published before it (whole H100s): an
    # update that compared against the footprint of the first recompute (MIG slices only, before and
    # after) would leave the claim diagnosed as if b1 still had four H100s.
    name = "incr-back-and-forth"
    fleet = new_fleet(name, random.Random(7))
    fleet.set_node("h1", "H100", "full", 2, {})
    fleet.set_node("b1", "A100", "static-mig", 1, {})
    want = nvidia.claim_object("team", "want-3", [nvidia.exactly_request("r0", "gpu.nvidia.com", 3)])
    fleet.write([{**want, "kind": "ResourceClaim"}])
    assert tasks.update_diagnoses(name)["full"] == 1
    summaries = []
    for model, mode, gpus in (("H100", "full", 4), ("A100", "static-mig", 1)):
        fleet.set_node("b1", model, mode, gpus, {})
        counts = tasks.update_diagnoses(name)
        assert "full" not in counts and counts["diagnosed"] == 1, (model, counts)
        assert stored(name) == fresh(name), model
        summaries.append(json.loads(stored(name)[("team", "want-3")])[1])
    assert summaries[0] != summaries[1], summaries


def diagnosed_fleet(name: str, seed: int) -> Fleet:
    """Cluster ``name``: one node of 2 H100s and 3 pending claims, diagnosed by a first (full) update."""
    fleet = new_fleet(name, random.Random(seed))
    fleet.set_node("h1", "H100", "full", 2, {})
    for _ in range(3):
        fleet.add_pending()
    tasks.update_diagnoses(name)
    assert stored(name) == fresh(name)
    return fleet


def fails_then_recomputes(
    name: str, monkeypatch: pytest.MonkeyPatch, owner: Any, attr: str, broken: Any, change: Any
) -> None:
    """``change`` the fleet; an update with ``owner.attr`` replaced by ``broken`` raises and leaves the
    stored diagnoses behind; the next update, with nothing new to apply, is a full recompute."""
    real = getattr(owner, attr)
    change()
    monkeypatch.setattr(owner, attr, broken)
    with pytest.raises(RuntimeError, match="connection lost"):
        tasks.update_diagnoses(name)
    assert stored(name) != fresh(name)
    monkeypatch.setattr(owner, attr, real)
    assert tasks.update_diagnoses(name).get("full") == 1
    assert stored(name) == fresh(name)


def test_an_update_that_fails_to_store_leaves_the_next_one_to_recompute(
    quiet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The failed update applied its events; what it reached is not stored.
    fleet = diagnosed_fleet("incr-failed-store", 9)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("connection lost")

    def change() -> None:
        fleet.set_node("h1", "H100", "full", 4, {})  # every pending claim's diagnosis changes

    fails_then_recomputes("incr-failed-store", monkeypatch, tasks, "_store_texts", broken, change)


def test_an_update_whose_events_fail_half_applied_leaves_the_next_one_to_recompute(
    quiet: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The slices are applied, then reading the claims back fails. A retry of the same events would find
    # the slices already equal to the database and reach nothing through them: only a full recompute
    # stores what the bigger node means for the claims already pending.
    from claims.livestate import LiveFleet

    fleet = diagnosed_fleet("incr-half-applied", 13)
    read = LiveFleet._read

    def fails_on_claims(self: LiveFleet, kind: str, keys: list[Any]) -> Any:
        if kind == "ResourceClaim":
            raise RuntimeError("connection lost")
        return read(self, kind, keys)

    def change() -> None:
        fleet.set_node("h1", "H100", "full", 4, {})
        fleet.add_pending()

    fails_then_recomputes("incr-half-applied", monkeypatch, LiveFleet, "_read", fails_on_claims, change)


def test_a_claim_whose_diagnosis_raises_leaves_the_others_diagnosed_and_updates_incremental(
    quiet: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A claim the engine cannot diagnose (a bug on one claim's shape) is logged by name and has no stored
    # diagnosis; the other claims are stored, and the updates after it stay incremental.
    fleet = diagnosed_fleet("incr-bad-claim", 21)
    real = tasks.diagnose
    calls: collections.Counter[str] = collections.Counter()

    # Marked in the spec, which a claim's shape holds (its labels it does not).
    def fails_on_marked(state: FleetState, obj: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if "explode" in json.dumps(obj.get("spec")):
            calls[str(obj["metadata"]["name"])] += 1
            raise RuntimeError("engine bug")
        return real(state, obj, *args, **kwargs)

    def bad_claim(name: str) -> dict[str, Any]:
        bad = nvidia.claim_object("team", name, [fleet.request()], created=fleet.created())
        bad["spec"]["devices"]["requests"][0]["name"] = "explode"
        bad["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": "gpu.nvidia.com"}
        return {**bad, "kind": "ResourceClaim"}

    monkeypatch.setattr(tasks, "diagnose", fails_on_marked)
    fleet.write([bad_claim("want-bad"), bad_claim("want-bad-2")])  # one shape
    fleet.add_pending()
    with caplog.at_level("ERROR", logger=tasks.log.name):
        counts = tasks.update_diagnoses("incr-bad-claim")
    assert "full" not in counts and counts["failed"] == 2 and counts["diagnosed"] >= 3
    assert "diagnosis of claim team/want-bad in cluster incr-bad-claim failed" in caplog.text
    assert "claim team/want-bad-2 in cluster incr-bad-claim failed as for an earlier claim" in caplog.text
    assert sum(calls.values()) == 1  # the shape's failure is kept: its other claims are not diagnosed again
    bad_keys = {("team", "want-bad"), ("team", "want-bad-2")}
    others = {k: v for k, v in fresh("incr-bad-claim").items() if k not in bad_keys}
    assert stored("incr-bad-claim") == others
    fleet.set_node("h1", "H100", "full", 4, {})
    fleet.add_pending()
    counts = tasks.update_diagnoses("incr-bad-claim")
    assert "full" not in counts and counts["written"] >= 1
    now = fresh("incr-bad-claim")
    assert len(now) == len(others) + 3
    assert stored("incr-bad-claim") == {k: v for k, v in now.items() if k not in bad_keys}
    # A claim diagnosed before whose diagnosis now fails loses its stored diagnosis: it shows as not
    # diagnosed, not as diagnosed on an older fleet.
    victim = next(k for k in stored("incr-bad-claim") if k not in bad_keys)
    changed = copy.deepcopy(fleet.objects[("ResourceClaim", *victim)])
    changed["spec"]["devices"]["requests"][0]["name"] = "explode"
    fleet.write([changed])
    counts = tasks.update_diagnoses("incr-bad-claim")
    assert "full" not in counts and counts["failed"] >= 1 and victim not in stored("incr-bad-claim")
    # The full recompute stores the same.
    assert tasks.recompute_diagnoses("incr-bad-claim")["failed"] == 3
    assert stored("incr-bad-claim") == {
        k: v for k, v in fresh("incr-bad-claim").items() if k not in {*bad_keys, victim}
    }


def test_a_recompute_where_every_claim_fails_raises(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # Every diagnosis raising is the fleet's or the engine's fault, not one claim's: the task fails loudly
    # (and the next update recomputes) instead of storing nothing and moving on.
    diagnosed_fleet("incr-all-fail", 23)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("engine bug")

    monkeypatch.setattr(tasks, "diagnose", broken)
    with pytest.raises(tasks.DiagnosisFailed, match="all 3 claims of cluster incr-all-fail"):
        tasks.recompute_diagnoses("incr-all-fail")


def test_the_live_links_keep_the_list_order_and_leave_earlier_states_alone() -> None:
    # Which pod of a claim comes first is what the diagnosis reads (its node selector, the scheduler's
    # message): a changed pod keeps its place in name order, as in a fleet loaded afresh.
    from claims.fleetstate import holders_by_device, pods_by_claim
    from claims.livestate import LiveFleet, _ByAge, key_of

    def pod(name: str, label: str) -> dict[str, Any]:
        return {
            "kind": "Pod",
            "metadata": {"namespace": "team", "name": name, "labels": {"v": label}},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]},
        }

    def claim(name: str, label: str) -> dict[str, Any]:
        results = [
            {"request": "r", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0", "shareID": name}
        ]
        return {
            "kind": "ResourceClaim",
            "metadata": {"namespace": "team", "name": name, "labels": {"v": label}},
            "status": {"allocation": {"devices": {"results": results}}},
        }

    live = LiveFleet("c", 1)
    for kind, objs in (
        ("Pod", [pod("p-a", "1"), pod("p-b", "1")]),
        ("ResourceClaim", [claim("c-a", "1"), claim("c-b", "1")]),
    ):
        live.objects[kind] = {key_of(o): o for o in objs}
    live.pods_by_claim = pods_by_claim(live.objects["Pod"].values())
    live.holders = holders_by_device(live.objects["ResourceClaim"].values())
    live.by_age = _ByAge.of(live.holders)
    before = live.state()
    first_pod, first_claim = (
        before.pods_of_claim(claim("c", "")),
        before.holders()[("gpu.nvidia.com", "n1", "gpu-0")],
    )
    for kind, new in (
        ("Pod", pod("p-c", "3")),  # a new pod: added, nothing removed
        ("Pod", pod("p-a", "2")),
        ("ResourceClaim", claim("c-a", "2")),
    ):
        live._replace(kind, key_of(new), new)
    after = live.state()
    assert [p["metadata"]["labels"]["v"] for p in after.pods_of_claim(claim("c", ""))] == ["2", "1", "3"]
    held = after.holders()[("gpu.nvidia.com", "n1", "gpu-0")]
    assert [(c["metadata"]["name"], c["metadata"]["labels"]["v"]) for c in held] == [
        ("c-a", "2"),
        ("c-b", "1"),
    ]
    # The state made before the change still reads what it was made from.
    assert (
        before.pods_of_claim(claim("c", "")) == first_pod and first_pod[0]["metadata"]["labels"]["v"] == "1"
    )
    assert before.holders()[("gpu.nvidia.com", "n1", "gpu-0")] is first_claim
    assert first_claim[0]["metadata"]["labels"]["v"] == "1"
    # So do the holders by age: the changed claim keeps its place (same creation time and name).
    for fleet_state, label in ((before, "1"), (after, "2")):
        order = fleet_state.holders_by_age()
        assert [(c["metadata"]["name"], c["metadata"]["labels"]["v"]) for c in order.every] == [
            ("c-a", label),
            ("c-b", "1"),
        ]
        assert order.unreserved == order.every
