"""A quiet kind's stream keeps its connection: the simulator's API server sends bookmarks, the watcher
counts them as signs of life and follows their version, so it neither reconnects for silence nor relists.

Through the HTTP protocol (KubeSource against SimulatorAPIServer), as the end-to-end benchmark runs it; the
silence limit is made short here (``idle_timeout``) instead of waiting the production 70 s.
"""

import threading

import pytest

from fleet import ingest
from fleet.kube.kubesource import KubeSource
from fleet.kube.reflector import Reflector, StreamConfig
from fleet.models import WatchCursor
from simulator import nvidia
from simulator.apiserver import SimulatorAPIServer
from simulator.cluster import SimulatedCluster

# The watch lasts 2.5 times the silence limit; the server bookmarks 10 times per silence limit.
CONFIG = StreamConfig(
    flush_interval=0.05, watch_timeout=5, idle_timeout=2, backoff_min=0.01, backoff_max=0.02
)
BOOKMARK_SECONDS = 0.2


class CountingCluster(SimulatedCluster):
    """The simulator, counting the lists and watches the server serves from it."""

    def __init__(self) -> None:
        super().__init__()
        self.lists = 0
        self.watches = 0

    def list(self, kind):
        self.lists += 1
        return super().list(kind)

    def watch(self, *args, **kwargs):
        self.watches += 1
        return super().watch(*args, **kwargs)


def serve(sim, tmp_path, bookmark_seconds):
    server = SimulatorAPIServer(sim, "t0ken", bookmark_seconds=bookmark_seconds)
    server.serve_in_thread()
    return server, KubeSource.from_kubeconfig(str(server.write_kubeconfig(tmp_path / "kubeconfig")))


@pytest.fixture
def sim():
    s = CountingCluster()
    for i in range(3):
        s.create(nvidia.node_object(f"node-{i}", "H100"))
    return s


def cursor():
    return WatchCursor.objects.get(kind="Node")


def test_a_quiet_stream_stays_on_one_connection_past_the_silence_limit(sim, tmp_path):
    server, source = serve(sim, tmp_path, BOOKMARK_SECONDS)
    try:
        reflector = Reflector(ingest.get_or_create_cluster("sim"), "Node", source, CONFIG)
        # Another kind changes meanwhile: the cluster's version moves on, the node watch's bookmarks follow.
        device_class = {
            "kind": "DeviceClass",
            "apiVersion": "resource.k8s.io/v1",
            "metadata": {"name": "gpu"},
        }
        threading.Timer(1.0, lambda: sim.create(device_class)).start()

        outcome = reflector.round(threading.Event())

        assert outcome.outcome == "watched"  # the server ended the watch; the silence limit never hit
        assert (sim.lists, sim.watches) == (1, 1)
        assert cursor().last_error == ""
        assert int(cursor().resource_version) == int(sim.resource_version)  # the bookmarks' version

        # The history drops everything up to now (churn elsewhere): the cursor is recent enough to resume.
        sim.compact()
        assert reflector.round(threading.Event()).outcome == "watched"
        assert (sim.lists, sim.watches) == (1, 2)
    finally:
        server.stop()
        source.close()


def test_without_bookmarks_the_silence_limit_reconnects(sim, tmp_path):
    """The limit the test above stays under: a silent watch is given up (then resumed from the cursor)."""
    server, source = serve(sim, tmp_path, bookmark_seconds=600)
    try:
        reflector = Reflector(ingest.get_or_create_cluster("sim"), "Node", source, CONFIG)
        outcome = reflector.round(threading.Event())
        assert outcome.outcome == "backoff"
        assert "no event or bookmark" in cursor().last_error
    finally:
        server.stop()
        source.close()
