"""The diagnosis trigger end to end, in the production topology.

A claim created on the real control plane is mirrored by a watch worker; ingest's change listener enqueues
``update_diagnoses``, which is routed to the "diagnosis" queue; the diagnosis worker (the only worker here
besides the watchers) stores the diagnosis. Publishing a device that fits must then move the stored
diagnosis from ``no-match`` to ``fits`` with no other prompt: the slice's change event alone has to trigger
the recomputation.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from claims.shaped import put_names
from dashboard.asgi import application
from fleet import ingest
from simulator import nvidia
from tests.controlplane.kube import Kube, wait_for
from tests.controlplane.launcher import ControlPlane
from tests.controlplane.nodes import for_create
from tests.watch.services import PrivateServices, Worker, private_services
from tests.websockets import ORIGIN, run_async, session_cookie

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
        SELECT s.category, s.summary, s.named, c.name, c.uid, d.pod_name FROM claims_claimdiagnosis d
        JOIN claims_diagnosisshape s ON s.id = d.shape_id
        JOIN claims_resourceclaim c ON c.id = d.claim_id
        JOIN fleet_cluster k ON k.id = c.cluster_id
        WHERE k.name = %s AND c.namespace = %s AND c.name = %s
    """
    with psycopg.connect(services.db_url.replace("postgres://", "postgresql://")) as conn:
        row = conn.execute(sql, (CLUSTER, namespace, name)).fetchone()
    if row is None:
        return None
    category, summary, named, claim, uid, pod = row
    return str(category), put_names(summary, claim, uid, pod, named=named)


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
        Worker(services, "diagnosis", clusters, log_dir, queues="diagnosis", beat=False),
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
                f"{services.count(CLUSTER, 'fleet_resourceslice')} slice(s) mirrored; diagnosis worker:\n"
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


WS_CLAIM = ("default", "ws-claim")
WS_NODE = "ws-node"


async def next_change(ws: Any, services: PrivateServices, want: str, timeout: float) -> tuple[str, str]:
    """Read ``/ws/pending/`` messages until one is followed by a stored diagnosis of category ``want``
    (a message is sent after the diagnoses it announces are committed); that diagnosis."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    seen: list[Any] = []
    while loop.time() < deadline:
        try:
            message = await ws.receive_json_from(timeout=max(0.1, deadline - loop.time()))
        except TimeoutError:
            break
        seen.append(message)
        if message.get("type") == "changed":
            stored = await sync_to_async(stored_diagnosis)(services, *WS_CLAIM)
            if stored and stored[0] == want:
                return stored
    raise AssertionError(
        f"no /ws/pending/ message announced a {want!r} diagnosis within {timeout} s: got {seen}, "
        f"stored {stored_diagnosis(services, *WS_CLAIM)}"
    )


@pytest.mark.django_db(transaction=True)
def test_the_pending_websocket_announces_a_diagnosis_changed_by_a_slice(
    services: PrivateServices, kube: Kube, control_plane: ControlPlane, client: Any, admin_user: Any
) -> None:
    """A slice published on the API server makes a pending claim fit, and removing it makes it pending
    for want of a device again: each time the incremental update stores the new diagnosis and the
    pending page's socket (the ASGI stack in this process, on the workers' Redis channel layer) says so.
    Slice changes alone are not announced by ingest: only the diagnosis task can have sent it."""
    log_dir = LOGS / "websocket"
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)
    clusters = f"{CLUSTER}=kubeconfig:{control_plane.kubeconfig}"
    for cls in nvidia.device_classes():
        if cls["metadata"]["name"] == "gpu.nvidia.com":
            with contextlib.suppress(Exception):  # created by the test above on the same control plane
                kube.create(for_create(cls))
    with contextlib.suppress(Exception):
        kube.create(for_create(nvidia.node_object(WS_NODE, "H100")))
    node_uid = kube.get("Node", WS_NODE)["metadata"]["uid"]
    wanted = nvidia.gpu_uuid(WS_NODE, 0)
    request = nvidia.exactly_request(
        "gpu", "gpu.nvidia.com", selectors=[f'device.attributes["gpu.nvidia.com"].uuid == "{wanted}"']
    )
    kube.delete("ResourceClaim", WS_CLAIM[1], WS_CLAIM[0])
    kube.create(for_create(nvidia.claim_object(*WS_CLAIM, [request])))
    slices = nvidia.node_slices(WS_NODE, "H100", gpus=1)
    for body in slices:
        kube.delete("ResourceSlice", body["metadata"]["name"])
    layer = {
        "default": {
            "BACKEND": "dashboard.channel_layer.ReconnectingRedisChannelLayer",
            "CONFIG": {"hosts": [{"address": services.redis_url}]},
        }
    }
    ingest.get_or_create_cluster(CLUSTER)  # the page's cluster filter names a known cluster
    cookie = session_cookie(client, admin_user)
    workers = [
        Worker(services, "watch", clusters, log_dir),
        Worker(services, "diagnosis", clusters, log_dir, queues="diagnosis", beat=False),
    ]
    try:
        first = wait_for(
            "the pending claim's first diagnosis",
            lambda: stored_diagnosis(services, *WS_CLAIM),
            timeout=STORED_WITHIN,
            interval=0.5,
        )
        assert first[0] == "no-match", first

        @run_async
        async def watch_the_page() -> None:
            ws = WebsocketCommunicator(
                application, f"/ws/pending/?cluster={CLUSTER}", headers=[ORIGIN, cookie]
            )
            connected, _ = await ws.connect()
            assert connected
            assert (await ws.receive_json_from(timeout=10))["type"] == "hello"
            for body in slices:
                for owner in body["metadata"].get("ownerReferences", []):
                    owner["uid"] = node_uid  # owned by the real Node, or the garbage collector deletes it
                await sync_to_async(kube.create)(for_create(body))
            fits = await next_change(ws, services, "fits", STORED_WITHIN)
            assert WS_NODE in fits[1], fits
            for body in slices:
                await sync_to_async(kube.delete)("ResourceSlice", body["metadata"]["name"])
            await next_change(ws, services, "no-match", STORED_WITHIN)
            await ws.disconnect()

        with override_settings(CHANNEL_LAYERS=layer):
            from channels.layers import channel_layers

            channel_layers.backends.clear()
            try:
                watch_the_page()
            finally:
                channel_layers.backends.clear()
        logs = "".join(w.output() for w in workers)
        assert "Traceback" not in logs, logs[-4000:]
    finally:
        for worker in workers:
            worker.stop()
        kube.delete("ResourceClaim", WS_CLAIM[1], WS_CLAIM[0])
