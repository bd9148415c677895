"""The diagnosis trigger end to end, in the production topology.

A claim created on the real control plane is mirrored by a watch worker; ingest's change listener
enqueues the debounced ``recompute_diagnoses`` on the default queue; a default-queue worker stores the
diagnosis. Publishing a device that fits must then move the stored diagnosis from ``no-match`` to
``fits`` with no other prompt: the slice's change event alone has to trigger the recomputation.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from simulator import nvidia
from tests.controlplane.kube import Kube, wait_for
from tests.controlplane.launcher import ControlPlane
from tests.controlplane.nodes import for_create
from tests.watch.services import PrivateServices, Worker, private_services

pytestmark = pytest.mark.controlplane

# Ports of our own: tests/watch runs its private instances on 55467/56467, possibly at the same time.
PG_PORT, REDIS_PORT = 55469, 56469
CLUSTER = "trigger"
NODE = "trigger-node"
CLAIM = ("default", "trigger-claim")
LOGS = Path(tempfile.gettempdir()) / "claimscope-trigger-logs"
# debounce window (5 s) + task countdown (5 s) + a watch round trip + the diagnosis itself, on a busy machine
STORED_WITHIN = 90.0


@pytest.fixture(scope="module")
def services() -> Iterator[PrivateServices]:
    with private_services(pg_port=PG_PORT, redis_port=REDIS_PORT) as svc:
        yield svc


def stored_diagnosis(services: PrivateServices, namespace: str, name: str) -> tuple[str, str] | None:
    sql = """
        SELECT d.category, d.summary FROM claims_claimdiagnosis d
        JOIN claims_resourceclaim c ON c.id = d.claim_id
        JOIN fleet_cluster k ON k.id = c.cluster_id
        WHERE k.name = %s AND c.namespace = %s AND c.name = %s
    """
    with psycopg.connect(services.db_url.replace("postgres://", "postgresql://")) as conn:
        row = conn.execute(sql, (CLUSTER, namespace, name)).fetchone()
    return (str(row[0]), str(row[1])) if row else None


def fitting(diagnosis: tuple[str, str] | None) -> tuple[str, str] | None:
    return diagnosis if diagnosis and diagnosis[0] == "fits" else None


def test_a_fleet_change_alone_recomputes_the_stored_diagnosis(
    services: PrivateServices, kube: Kube, control_plane: ControlPlane
) -> None:
    log_dir = LOGS / "fleet-change"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    clusters = f"{CLUSTER}=kubeconfig:{control_plane.kubeconfig}"
    for cls in nvidia.device_classes():
        if cls["metadata"]["name"] == "gpu.nvidia.com":
            kube.create(for_create(cls))
    with contextlib.suppress(Exception):  # left by an earlier run against the same control plane
        kube.create(for_create(nvidia.node_object(NODE, "H100")))
    node_uid = kube.get("Node", NODE)["metadata"]["uid"]
    # Only GPU 0 of the node we publish later matches: whatever else the shared control plane holds,
    # the claim cannot fit before that slice exists.
    wanted = nvidia.gpu_uuid(NODE, 0)
    request = nvidia.exactly_request(
        "gpu", "gpu.nvidia.com", selectors=[f'device.attributes["gpu.nvidia.com"].uuid == "{wanted}"']
    )
    claim = for_create(nvidia.claim_object("default", "trigger-claim", [request]))
    kube.delete("ResourceClaim", "trigger-claim", "default")
    kube.create(claim)

    workers = [
        Worker(services, "watch", clusters, log_dir),
        Worker(services, "default", clusters, log_dir, queues="celery", beat=False),
    ]
    try:
        first = wait_for(
            "the pending claim's first diagnosis",
            lambda: stored_diagnosis(services, "default", "trigger-claim"),
            timeout=STORED_WITHIN,
            interval=0.5,
        )
        assert first[0] == "no-match", first

        for body in nvidia.node_slices(NODE, "H100", gpus=1):
            # The driver's slices are owned by their Node: with the simulator's uid the garbage collector
            # would delete them as orphans at once.
            for owner in body["metadata"].get("ownerReferences", []):
                owner["uid"] = node_uid
            kube.create(for_create(body))
        try:
            fits = wait_for(
                "the diagnosis to follow the new slice",
                lambda: fitting(stored_diagnosis(services, *CLAIM)),
                timeout=STORED_WITHIN,
                interval=0.5,
            )
        except TimeoutError as err:
            raise AssertionError(
                f"{err}: stored {stored_diagnosis(services, *CLAIM)}, "
                f"{services.count(CLUSTER, 'fleet_resourceslice')} slice(s) mirrored; default worker:\n"
                + workers[1].output()[-3000:]
            ) from None
        assert NODE in fits[1], fits
        logs = "".join(w.output() for w in workers)
        assert "claims.tasks.update_diagnoses" in logs
        assert "Traceback" not in logs, logs[-4000:]
    finally:
        for worker in workers:
            worker.stop()
        kube.delete("ResourceClaim", "trigger-claim", "default")
