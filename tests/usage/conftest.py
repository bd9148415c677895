"""Utilization tests: the small simulated cluster in the database, its dcgm-exporter stand-in served over
HTTP and scraped by the real Prometheus."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from fleet import ingest
from fleet.importer import import_objects
from fleet.models import Cluster
from simulator import dcgm
from simulator.workloads import Simulation
from tests.browser.conftest import browser, chromium_path, page  # noqa: F401  (the browser fixtures)
from tests.databases import require_expected_backend
from tests.usage import prom, scenario
from usage.config import PrometheusConfig
from usage.prometheus import PrometheusSource

CLUSTER = "usage-test"
# A GPU of a node the fleet does not know (an exporter left over from a removed node).
FOREIGN = dcgm.Series(
    dcgm.ENGINE_ACTIVE,
    {
        "gpu": "0",
        "UUID": "GPU-00000000-dead-beef-0000-000000000000",
        "pci_bus_id": "0000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": "gone-node",
    },
    0.5,
)


@pytest.fixture(autouse=True)
def _require_expected_backend(request):
    if "db" in request.fixturenames or "transactional_db" in request.fixturenames:
        request.getfixturevalue("db" if "db" in request.fixturenames else "transactional_db")
        require_expected_backend("utilization")


@pytest.fixture
def sim() -> Simulation:
    return scenario.simulation()


@pytest.fixture
def cluster(db, sim, monkeypatch) -> Cluster:
    # Nobody consumes change events here; the fleet rows are what the join reads.
    monkeypatch.setattr(ingest.events, "publish", lambda event: None)
    monkeypatch.setattr(ingest.events, "_listeners", [])
    c = ingest.get_or_create_cluster(CLUSTER)
    import_objects(c, scenario.grouped(sim.cluster))
    return c


@pytest.fixture
def exporter(sim):
    """The stand-in serving the simulated cluster's series now, plus one foreign GPU."""
    ex = dcgm.DcgmExporter(lambda: [*dcgm.cluster_series(sim.cluster, dcgm.now()), FOREIGN])
    ex.start()
    yield ex
    ex.stop()


@pytest.fixture
def prometheus_url() -> str:
    return prom.prometheus_url()


@pytest.fixture
def scraped(prometheus_url, exporter) -> Iterator[Callable[[int], PrometheusSource]]:
    """Registers the stand-in with the shared Prometheus; calling it waits until ``n`` entities are seen
    and returns the source (queries filtered on this test's ``run`` label)."""
    with prom.target(prometheus_url, "dcgm", exporter.port) as run:
        source = PrometheusSource(PrometheusConfig(CLUSTER, prometheus_url, labels=(("run", run),)))

        def wait(n: int) -> PrometheusSource:
            def seen() -> bool:
                found = source.entities().entities
                return len({e.labels.get("UUID", "") + e.labels.get("GPU_I_ID", "") for e in found}) >= n

            prom.wait_for(seen, f"{n} DCGM entities scraped from the stand-in on port {exporter.port}")
            return source

        yield wait
