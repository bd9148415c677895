"""The reflector against the simulator's API (the same Source protocol as a real API server)."""

import copy
import logging
import threading
import time

import pytest

from fleet import ingest
from fleet.kube.reflector import Reflector, StreamConfig
from fleet.models import Node, Pod, WatchCursor
from simulator import nvidia
from simulator.cluster import SimulatedCluster

FAST = StreamConfig(
    flush_interval=0.05, watch_timeout=0.2, idle_timeout=5, backoff_min=0.01, backoff_max=0.02
)


@pytest.fixture
def cluster():
    return ingest.get_or_create_cluster("sim")


@pytest.fixture
def sim():
    s = SimulatedCluster(history_limit=100)
    for i in range(3):
        s.create(nvidia.node_object(f"node-{i}", "H100"))
    return s


def names():
    return sorted(Node.objects.values_list("name", flat=True))


def run_once(reflector):
    reflector.run(threading.Event(), max_watches=1)


def test_initial_sync_lists_then_watches(cluster, sim):
    reflector = Reflector(cluster, "Node", sim, FAST)
    run_once(reflector)
    assert names() == ["node-0", "node-1", "node-2"]
    cursor = WatchCursor.objects.get(cluster=cluster, kind="Node")
    assert int(cursor.resource_version) == int(sim.resource_version)
    assert cursor.state == "watching"


def test_it_resumes_from_the_cursor_and_applies_changes(cluster, sim):
    reflector = Reflector(cluster, "Node", sim, FAST)
    run_once(reflector)
    sim.create(nvidia.node_object("node-9", "B200"))
    sim.delete("Node", None, "node-0")
    changed = copy.deepcopy(sim.get("Node", None, "node-1"))
    changed["metadata"]["labels"]["team"] = "ml"
    sim.update(changed)
    run_once(reflector)
    assert names() == ["node-1", "node-2", "node-9"]
    assert Node.objects.get(name="node-1").labels["team"] == "ml"
    assert reflector.events_applied == 3


def test_it_relists_after_410(cluster, sim):
    reflector = Reflector(cluster, "Node", sim, FAST)
    run_once(reflector)
    sim.delete("Node", None, "node-2")
    sim.create(nvidia.node_object("node-7", "B300"))
    sim.compact()  # the history no longer reaches our cursor: the next watch gets 410 Expired
    run_once(reflector)  # 410 -> relist (this watch ends the loop)
    run_once(reflector)
    assert names() == ["node-0", "node-1", "node-7"]


def test_a_malformed_object_is_logged_and_skipped(cluster, sim, caplog):
    reflector = Reflector(cluster, "Node", sim, FAST)
    run_once(reflector)
    bad = nvidia.node_object("node-bad", "H100")
    bad["metadata"]["labels"] = ["not", "a", "map"]
    sim.create(bad)
    sim.create(nvidia.node_object("node-good", "H100"))
    with caplog.at_level(logging.WARNING):
        run_once(reflector)
    assert "node-good" in names() and "node-bad" not in names()
    assert "node-bad" in caplog.text and "metadata.labels" in caplog.text


def test_pods_without_gpu_claims_are_not_stored(cluster, sim):
    sim.create(nvidia.pod_object("ml", "trainer", claims=[("gpu", "tmpl")]))
    plain = nvidia.pod_object("ml", "web", claims=[])
    sim.create(plain)
    run_once(Reflector(cluster, "Pod", sim, FAST))
    assert list(Pod.objects.values_list("name", flat=True)) == ["trainer"]


class FlakySource:
    """Fails the first watch with a connection error, then behaves."""

    def __init__(self, inner):
        self.inner = inner
        self.failures = 1

    def list(self, kind):
        return self.inner.list(kind)

    def watch(self, kind, rv, timeout_seconds=None):
        if self.failures:
            self.failures -= 1
            raise ConnectionRefusedError("connection refused")
        return self.inner.watch(kind, rv, timeout_seconds)


class ForbiddenSource:
    def list(self, kind):
        return [], "1"

    def watch(self, kind, rv, timeout_seconds=None):
        yield {
            "type": "ERROR",
            "object": {"kind": "Status", "code": 403, "message": 'nodes is forbidden: User "x"'},
        }


@pytest.mark.django_db(transaction=True)
def test_forbidden_marks_the_stream_and_does_not_crash(cluster):
    stop = threading.Event()
    reflector = Reflector(cluster, "Node", ForbiddenSource(), StreamConfig(forbidden_retry=0.01))
    thread = threading.Thread(target=reflector.run, args=(stop,))
    thread.start()
    try:
        for _ in range(200):
            cursor = WatchCursor.objects.filter(cluster=cluster, kind="Node", state="forbidden").first()
            if cursor:
                break
            stop.wait(0.02)
        assert cursor is not None
        assert "forbidden" in cursor.last_error
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


def test_connection_errors_back_off_and_recover(cluster, sim):
    source = FlakySource(sim)
    reflector = Reflector(cluster, "Node", source, FAST)
    reflector.run(threading.Event(), max_watches=1)
    assert source.failures == 0
    assert names() == ["node-0", "node-1", "node-2"]
    assert "connection refused" in WatchCursor.objects.get(cluster=cluster, kind="Node").last_error


def test_a_late_writer_never_moves_the_cursor_back_but_a_relist_sets_it(cluster):
    # Two writers overlap when a frozen worker wakes after another took its stream over: the late batch
    # (an older resourceVersion) must not make the next round resume from before the newer one.
    ingest.apply_batch(cluster, "Node", [], cursor=ingest.CursorUpdate(500))
    ingest.apply_batch(cluster, "Node", [], cursor=ingest.CursorUpdate(420))
    assert WatchCursor.objects.get(cluster=cluster, kind="Node").resource_version == 500
    ingest.replace_all(cluster, "Node", [], 30)  # a relist after a 410: the history may have restarted
    assert WatchCursor.objects.get(cluster=cluster, kind="Node").resource_version == 30


class GatedSource:
    """A watch of two Node events: the second only once the test lets it go, then the end once told."""

    def __init__(self) -> None:
        self.first = threading.Event()  # the reflector's reader holds the first event
        self.second = threading.Event()
        self.queued = threading.Event()  # ... and the second
        self.end = threading.Event()

    def list(self, kind):
        return [], "0"  # not called: the test watches from a version

    def watch(self, kind, resource_version, timeout_seconds=None):
        yield {"type": "ADDED", "object": self.node("node-a", "1")}
        self.first.set()  # asked for the next event: the first is in the reader's queue
        self.second.wait(10)
        yield {"type": "ADDED", "object": self.node("node-b", "2")}
        self.queued.set()
        self.end.wait(10)

    @staticmethod
    def node(name, resource_version):
        obj = nvidia.node_object(name, "H100")
        obj["metadata"]["resourceVersion"] = resource_version
        return obj


def test_events_that_waited_through_a_batch_are_applied_without_a_window_of_their_own(cluster):
    # A batch window of 30 s on a clock the test moves. The first event's window passes (the clock jumps);
    # while its batch is applied the second event arrives, and the apply takes another 31 s of the clock.
    # The second event then waited longer than a window already: it is applied as soon as it is read,
    # not 30 s after (the window runs from when the reader received an event, not from when the batch
    # loop got to it).
    offset = [0.0]
    source = GatedSource()
    reflector = Reflector(
        cluster,
        "Node",
        source,
        StreamConfig(flush_interval=30.0, idle_timeout=300.0),
        clock=lambda: time.monotonic() + offset[0],
    )
    applied: list[list[str]] = []
    stop = threading.Event()
    late: list[bool] = []  # per batch: applied only because the watch was being stopped

    def flush(changes, resource_version):
        applied.append([c.record.meta.name for c in changes])
        late.append(stop.is_set())
        if len(applied) == 1:
            source.second.set()
            assert source.queued.wait(10)
            offset[0] += 31.0
        else:
            stop.set()
            source.end.set()
        return resource_version

    def first_window_passes():
        source.first.wait(10)
        offset[0] = 31.0

    reflector._flush = flush  # type: ignore[method-assign]
    mover = threading.Thread(target=first_window_passes, daemon=True)
    mover.start()
    timer = threading.Timer(10, stop.set)  # the second event's 30-s window would end the test here
    timer.start()
    try:
        reflector.watch(0, stop)
    finally:
        timer.cancel()
    mover.join(10)
    assert applied == [["node-a"], ["node-b"]]
    assert late == [False, False]
