"""The versioned feed: a snapshot plus the deltas after any sequence of ingest batches equals a fresh
snapshot, for every filter; events fire after commit, one per batch."""

from __future__ import annotations

import copy
import random

import pytest

from fleet import feed, heatmap, ingest, selectors
from fleet.filters import FleetFilter
from fleet.models import Cluster
from tests.fleet_pages.conftest import FIXTURE_GPUS, FleetEditor

pytestmark = pytest.mark.django_db(transaction=True)

FILTERS = [
    FleetFilter(),
    FleetFilter(cluster="fixtures"),
    FleetFilter(model="H100"),
    FleetFilter(state="free"),
    FleetFilter(state="allocated"),
    FleetFilter(state="tainted"),
    FleetFilter(label="nvidia.com/gpu.product=NVIDIA-B200"),
    FleetFilter(label="team=vision"),
    FleetFilter(pool="b200-a1"),
    FleetFilter(cluster="other"),
]


@pytest.fixture
def events(monkeypatch):
    """Change events as published (after commit), in order."""
    published: list[dict] = []
    monkeypatch.setattr(ingest, "publish", published.append)
    return published


def random_batch(rng: random.Random, ed: FleetEditor, state: dict) -> None:
    """One ingest batch picked at random: (de)allocate or delete a claim, (un)taint GPUs, drop or restore a
    slice, relabel a node."""
    op = rng.choice(["deallocate", "restore", "delete_claim", "taint", "untaint", "drop_slice", "relabel"])
    claims = ed.allocated_claims()
    slices = ed.gpu_slices()
    if op == "deallocate":
        ed.deallocate(rng.choice(claims))
    elif op == "restore":
        ed.upsert("ResourceClaim", rng.choice(claims))
    elif op == "delete_claim":
        ed.delete("ResourceClaim", rng.choice(claims))
    elif op in ("taint", "untaint"):
        ed.taint_devices(rng.choice(slices), rng.randint(1, 8), on=op == "taint")
    elif op == "drop_slice":
        victim = rng.choice(slices)
        ed.delete("ResourceSlice", victim)
        state.setdefault("dropped", []).append(victim)
    elif state.get("dropped") and rng.random() < 0.5:
        ed.upsert("ResourceSlice", state["dropped"].pop())
    else:
        node = copy.deepcopy(rng.choice(ed.objects["Node"]))
        node["metadata"].setdefault("labels", {})["team"] = rng.choice(["vision", "speech"])
        ed.upsert("Node", node)


@pytest.mark.parametrize("seed", [1, 2])
def test_snapshot_plus_deltas_equals_a_fresh_snapshot_after_random_ingest_batches(fleet, events, seed):
    rng = random.Random(seed)
    ed = FleetEditor()
    feeds = [feed.FleetFeed(f) for f in FILTERS]
    clients = []
    for f in feeds:
        message = f.snapshot()
        clients.append({"rows": message["rows"], "version": message["version"]})
    state: dict = {}
    for _ in range(30):
        for _ in range(rng.randint(1, 3)):  # several batches may coalesce into one delta
            random_batch(rng, ed, state)
        for event in events:
            for f in feeds:
                f.mark(event)
        events.clear()
        for f, client in zip(feeds, clients, strict=True):
            delta = f.delta()
            if delta is not None:
                assert delta["version"] == client["version"] + 1
                client["rows"] = feed.apply_message(client["rows"], delta)
                client["version"] = delta["version"]
    changed = 0
    for f, client in zip(feeds, clients, strict=True):
        # Against rows built from scratch: the shared cache must not agree with itself only.
        assert client["rows"] == feed.rows_from_devices(f.filters), f.filters
        assert feed.load_rows(f.filters) == client["rows"], f.filters
        changed += client["version"] > 1
    assert changed >= 5  # the sequence really moved most views


def test_one_change_event_per_batch_after_commit_naming_what_was_written(fleet, events, editor):
    claim = editor.allocated_claims()[0]
    editor.deallocate(claim)
    assert events == [
        {
            "type": "fleet.change",
            "cluster": "fixtures",
            "kind": "ResourceClaim",
            "written": [f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"],
            "deleted": [],
        }
    ]


def test_a_deallocated_claim_frees_its_gpu_in_the_next_delta(fleet, events, editor):
    live = feed.FleetFeed(FleetFilter())
    before = live.snapshot()["rows"]
    whole = next(
        c
        for c in editor.allocated_claims()
        if all("mig" not in r["device"] for r in c["status"]["allocation"]["devices"]["results"])
    )
    editor.deallocate(whole)
    assert live.mark(events[-1])
    message = live.delta()
    assert message is not None and message["version"] == 2 and message["removed"] == []
    pools = {r["pool"] for r in whole["status"]["allocation"]["devices"]["results"]}
    assert {row[1] for row in message["rows"].values()} == pools  # NVIDIA pools are named after nodes
    used = lambda rows: sum(c[1] for r in rows.values() for c in r[4])  # noqa: E731
    assert used(feed.apply_message(before, message)) < used(before)


def test_events_of_other_clusters_or_irrelevant_kinds_send_nothing(fleet, events, editor):
    live = feed.FleetFeed(FleetFilter(cluster="fixtures"))
    live.snapshot()
    assert not live.mark({"type": "fleet.change", "cluster": "elsewhere", "kind": "ResourceSlice"})
    assert not live.mark({"type": "fleet.change", "cluster": "fixtures", "kind": "Event"})
    assert live.delta() is None
    assert live.mark({"type": "fleet.change", "cluster": "fixtures", "kind": "ResourceSlice"})
    assert live.delta() is None  # nothing actually changed: no message, no version bump
    assert live.version == 1


def test_a_change_rereads_only_the_pools_it_touched_and_connections_share_the_rows(fleet, editor):
    first = feed.load_rows(FleetFilter())
    assert feed.load_rows(FleetFilter()) is first  # nothing changed: the same rows, not rebuilt
    reads = feed.CACHE.reads
    slice_obj = editor.gpu_slices()[0]
    editor.taint_devices(slice_obj, 2)
    rows = feed.load_rows(FleetFilter())
    assert feed.CACHE.reads == reads + 1  # the one pool whose slice was written
    node = slice_obj["spec"]["nodeName"]
    assert sum(bool(c[2] & heatmap.TAINTED) for c in rows[f"fixtures/{node}"][4]) >= 2
    assert rows == feed.rows_from_devices(FleetFilter())


def test_snapshot_rows_have_one_cell_per_physical_gpu(fleet):
    rows = feed.load_rows(FleetFilter())
    assert heatmap.summary(rows)["gpus"] == FIXTURE_GPUS
    indexes = {(key, cell[0]) for key, row in rows.items() for cell in row[4]}
    assert len(indexes) == FIXTURE_GPUS


def test_rows_aggregated_per_gpu_in_sql_equal_rows_built_from_every_device(fleet):
    """load_rows aggregates per GPU in PostgreSQL and applies the counter rule to pools holding an
    allocated partition only; the cells must equal the Python reference over every device's counters."""
    names = dict(Cluster.objects.values_list("id", "name"))
    devices, counter_sets = selectors.heatmap_devices(list(names))  # counters_consumed of every device
    holders = selectors.allocation_holders(list(names))
    full = heatmap.build_rows(devices, set(holders), counter_sets, holders, names, {}, FleetFilter())
    assert feed.load_rows(FleetFilter()) == full
    for f in FILTERS:
        assert feed.load_rows(f) == feed.rows_from_devices(f), f
    flags = [cell[2] for row in full.values() for cell in row[4]]
    assert any(f & heatmap.UNAVAILABLE for f in flags)  # the dynamic-MIG rule is exercised
    assert any("dynamic" in cell[3] for row in full.values() for cell in row[4])


@pytest.mark.django_db(transaction=True)
def test_warm_up_fills_the_cache_from_its_own_thread(fleet):
    """What CLAIMSCOPE_WARM_HEATMAP starts in a web process: afterwards the first view reads nothing."""
    import threading

    thread = threading.Thread(target=feed.warm)
    thread.start()
    thread.join(60)
    reads = feed.CACHE.reads
    assert reads > 0  # the warm-up read the fleet's pools
    rows = feed.load_rows(FleetFilter())
    assert feed.CACHE.reads == reads  # ... so the first view found them cached
    assert rows == feed.rows_from_devices(FleetFilter())
