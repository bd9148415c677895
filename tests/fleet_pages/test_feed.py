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
    monkeypatch.setattr(ingest.events, "publish", published.append)
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


@pytest.fixture
def listening():
    """The shared cache as a websocket consumer makes it: told what changed by the events it is given."""
    feed.CACHE.listen()
    yield feed.CACHE
    feed.CACHE.unlisten()


@pytest.fixture
def pool_reads(monkeypatch):
    """The pools each ``selectors.pool_versions`` call asked for (None: every pool of the clusters)."""
    calls: list[set | None] = []
    real = selectors.pool_versions

    def spy(cluster_ids, pools=None):
        calls.append(None if pools is None else {k[1:] for k in pools})
        return real(cluster_ids, pools)

    monkeypatch.setattr(selectors, "pool_versions", spy)
    return calls


@pytest.mark.parametrize(("seed", "listen"), [(1, False), (2, False), (1, True), (3, True)])
def test_snapshot_plus_deltas_equals_a_fresh_snapshot_after_random_ingest_batches(
    fleet, events, seed, listen
):
    """``listen``: the cache reads only the pools the events name (as under a websocket consumer);
    otherwise it checks every pool's version on each refresh."""
    if listen:
        feed.CACHE.listen()
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


def allocated_pools(claim: dict) -> list[tuple[str, str]]:
    return sorted({(r["driver"], r["pool"]) for r in claim["status"]["allocation"]["devices"]["results"]})


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
            "pools": [list(p) for p in allocated_pools(claim)],  # the allocations it dropped
        }
    ]


def test_events_name_the_pools_of_deleted_allocations_and_written_slices(fleet, events, editor):
    claims = editor.allocated_claims()
    editor.delete("ResourceClaim", claims[0])
    assert events[-1]["deleted"] and events[-1]["pools"] == [list(p) for p in allocated_pools(claims[0])]
    # Deleted and recreated under its name while unobserved: the old uid's allocations go, and count.
    recreated = copy.deepcopy(claims[1])
    recreated["metadata"]["uid"] = "recreated-uid"
    recreated.pop("status")
    editor.upsert("ResourceClaim", recreated)
    assert events[-1]["pools"] == [list(p) for p in allocated_pools(claims[1])]
    slice_obj = editor.gpu_slices()[0]
    editor.taint_devices(slice_obj, 1)
    assert events[-1]["pools"] == [[slice_obj["spec"]["driver"], slice_obj["spec"]["pool"]["name"]]]
    editor.upsert("Node", editor.objects["Node"][0])
    assert events[-1]["pools"] == []  # a node holds no pool's devices


def test_events_name_the_pool_of_a_slice_that_publishes_only_counters(fleet, events, editor):
    # No device rows: the slice's own pool is named, so the heatmap re-reads the pool's counter sets.
    (counters,) = [s for s in editor.objects["ResourceSlice"] if not s["spec"].get("devices")]
    assert counters["spec"]["sharedCounters"]
    pool = [counters["spec"]["driver"], counters["spec"]["pool"]["name"]]
    changed = copy.deepcopy(counters)
    changed["spec"]["sharedCounters"][0]["counters"] = {}
    editor.upsert("ResourceSlice", changed)
    assert events[-1]["written"] and events[-1]["pools"] == [pool]
    moved = copy.deepcopy(changed)
    moved["spec"]["pool"]["name"] = "elsewhere"
    editor.upsert("ResourceSlice", moved)
    assert events[-1]["pools"] == sorted([pool, [pool[0], "elsewhere"]])  # the old pool and the new
    editor.delete("ResourceSlice", moved)
    assert events[-1]["deleted"] and events[-1]["pools"] == [[pool[0], "elsewhere"]]


def test_a_listening_cache_rereads_only_the_pools_an_event_names(
    fleet, events, editor, listening, pool_reads
):
    before = feed.load_rows(FleetFilter())
    assert pool_reads == [None]  # the first refresh checks every pool: nothing was heard before it
    reads, checks = listening.reads, listening.full_checks
    slice_obj = editor.gpu_slices()[0]
    editor.taint_devices(slice_obj, 2)
    feed.FleetFeed(FleetFilter(model="H100")).mark(events[-1])  # any connection's feed marks the cache
    rows = feed.load_rows(FleetFilter())
    pool = (slice_obj["spec"]["driver"], slice_obj["spec"]["pool"]["name"])
    assert pool_reads[1:] == [{pool}]  # that pool's version only, not the cluster's
    assert listening.reads == reads + 1 and listening.full_checks == checks
    assert rows != before and rows == feed.rows_from_devices(FleetFilter())
    claim = editor.allocated_claims()[0]
    editor.delete("ResourceClaim", claim)  # a deletion marks the pools its allocations were in
    listening.mark(events[-1])
    rows = feed.load_rows(FleetFilter())
    assert pool_reads[2:] == [set(allocated_pools(claim))]
    assert rows == feed.rows_from_devices(FleetFilter())


def test_a_lost_event_converges_at_the_next_full_check(fleet, events, editor, listening, monkeypatch):
    before = feed.load_rows(FleetFilter())
    editor.deallocate(editor.allocated_claims()[0])  # its event never reaches the cache
    assert feed.load_rows(FleetFilter()) == before  # not known yet: the cache trusts its events
    start = feed._now()
    monkeypatch.setattr(feed, "_now", lambda: start + feed.FULL_CHECK_SECONDS)
    rows = feed.load_rows(FleetFilter())
    assert rows != before and rows == feed.rows_from_devices(FleetFilter())


def test_an_event_without_pools_or_a_relist_rechecks_its_whole_cluster(fleet, events, editor, listening):
    before = feed.load_rows(FleetFilter())
    editor.deallocate(editor.allocated_claims()[0])
    listening.mark({"type": "fleet.change", "cluster": "fixtures", "kind": "ResourceClaim", "written": []})
    checks = listening.full_checks
    rows = feed.load_rows(FleetFilter())
    assert rows != before and rows == feed.rows_from_devices(FleetFilter())
    assert listening.full_checks == checks  # one cluster's pools, without the timer's full check
    editor.deallocate(editor.allocated_claims()[1])
    listening.mark({"type": "fleet.change", "cluster": "fixtures", "kind": "ResourceClaim", "resync": True})
    assert feed.load_rows(FleetFilter()) == feed.rows_from_devices(FleetFilter())


def test_the_first_listener_makes_the_cache_check_what_nobody_heard(fleet, editor):
    feed.CACHE.listen()
    feed.load_rows(FleetFilter())
    feed.CACHE.unlisten()
    editor.deallocate(editor.allocated_claims()[0])  # while no consumer listens: no event marked
    feed.CACHE.listen()
    assert feed.load_rows(FleetFilter()) == feed.rows_from_devices(FleetFilter())


@pytest.mark.parametrize(
    "pools",
    [[["d", "p", "x"]], [["d", 1]], ["d/p"], {"d": "p"}, None],
    ids=["triple", "int", "str", "dict", "none"],
)
def test_an_event_with_malformed_pools_means_every_pool(pools):
    assert feed.event_pools({"kind": "ResourceSlice", "cluster": "c", "pools": pools}) is None
    assert feed.event_pools({"kind": "ResourceSlice", "pools": [["d", "p"]]}) == {("d", "p")}


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


def test_a_device_taint_rule_taints_its_gpu_in_the_next_delta(fleet, events, editor, listening):
    live = feed.FleetFeed(FleetFilter())
    live.snapshot()
    target = editor.gpu_slices()[0]
    pool = target["spec"]["pool"]["name"]
    editor.taint_rule("drain", {"pool": pool})
    assert events[-1]["kind"] == "DeviceTaintRule"
    assert live.mark(events[-1])  # its event names no pool: the cluster is checked, the pool's slices moved
    message = live.delta()
    assert message is not None and {row[1] for row in message["rows"].values()} == {pool}
    assert feed.load_rows(FleetFilter()) == feed.rows_from_devices(FleetFilter())
