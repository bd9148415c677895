"""Objects of every watched kind for the control plane, database look-ups, verify, and apiserver faults."""

from __future__ import annotations

import base64
import io
import signal
from typing import Any

import orjson
import urllib3
from django.core.management import call_command

from fleet import ingest
from fleet.models import Cluster
from simulator import nvidia
from tests.controlplane.kube import Kube, Obj, wait_for
from tests.controlplane.launcher import ControlPlane
from tests.controlplane.nodes import for_create

VISIBLE_WITHIN = 2.0  # seconds: the bound for a change to reach the database
CONVERGE_WITHIN = 60.0  # after a fault: reconnect backoff + relist


def gpu_request() -> Obj:
    return nvidia.exactly_request("gpu", "gpu.nvidia.com")


def make(kind: str, name: str, namespace: str = "") -> Obj:
    """A valid object of ``kind`` for creation on the control plane."""
    if kind == "Node":
        return for_create(nvidia.node_object(name, "H100"))
    if kind == "DeviceClass":
        cls = for_create(nvidia.device_classes()[0])
        cls["metadata"] = {"name": name}
        return cls
    if kind == "ResourceSlice":
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {
                "driver": "gpu.nvidia.com",
                "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
            },
        }
    if kind == "ResourceClaimTemplate":
        return for_create(nvidia.claim_template(namespace, name, [gpu_request()]))
    if kind == "ResourceClaim":
        return for_create(nvidia.claim_object(namespace, name, [gpu_request()]))
    if kind == "Pod":
        return for_create(nvidia.pod_object(namespace, name, [("gpu", {"resourceClaimName": "absent"})]))
    if kind == "Event":
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "reason": "FailedScheduling",
            "type": "Warning",
            "message": "0/1 nodes are available: 1 cannot allocate all claims.",
            "involvedObject": {"kind": "Pod", "namespace": namespace, "name": "trainer"},
            "count": 1,
        }
    if kind == "DeviceTaintRule":
        taint = {"key": "example.com/maintenance", "effect": "NoSchedule"}
        return for_create(nvidia.device_taint_rule(name, taint, driver="gpu.nvidia.com", pool=name))
    raise ValueError(kind)


def stored(cluster: str, kind: str, name: str, namespace: str = "") -> dict[str, Any] | None:
    """The stored row of an object (its labels and resourceVersion), or None."""
    spec = ingest.SPECS[kind]
    rows = spec.model._default_manager.filter(cluster__name=cluster, name=name)
    if namespace:
        rows = rows.filter(namespace=namespace)
    row = rows.values("labels", "resource_version", "uid").first()
    return dict(row) if row else None


def count(cluster: str, kind: str) -> int:
    return int(ingest.SPECS[kind].model._default_manager.filter(cluster__name=cluster).count())


def verify(cluster: str, kind: str | None = None) -> tuple[int, str]:
    """`manage.py verify --cluster C`: (exit status, output)."""
    out = io.StringIO()
    args = ["verify", "--cluster", cluster] + (["--kind", kind] if kind else [])
    try:
        call_command(*args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def wait_converged(cluster: str, kind: str | None = None, timeout: float = CONVERGE_WITHIN) -> str:
    """Waits until verify finds no difference; returns its output."""

    def clean() -> str | None:
        status, output = verify(cluster, kind)
        return output if status == 0 else None

    return wait_for(f"{cluster} to converge (verify)", clean, timeout=timeout, interval=0.5)


def cursor_state(cluster: str, kind: str) -> str:
    c = Cluster.objects.filter(name=cluster).first()
    cursor = c.cursors.filter(kind=kind).first() if c else None
    return cursor.state if cursor else ""


# ------------------------------------------------------------------------------- apiserver faults


def _apiserver(cp: ControlPlane) -> Any:
    return next(p for name, p in cp._procs if name == "kube-apiserver")


def etcd_url(cp: ControlPlane) -> str:
    args = _apiserver(cp).args
    return next(a.split("=", 1)[1] for a in args if a.startswith("--etcd-servers="))


def compact_etcd(cp: ControlPlane) -> int:
    """Compacts etcd's history up to its current revision; returns that revision."""
    http = urllib3.PoolManager()
    url = etcd_url(cp)
    key = base64.b64encode(b"/").decode()
    head = orjson.loads(http.request("POST", f"{url}/v3/kv/range", body=orjson.dumps({"key": key})).data)
    revision = int(head["header"]["revision"])
    http.request("POST", f"{url}/v3/kv/compaction", body=orjson.dumps({"revision": revision}))
    return revision


def kill_apiserver(cp: ControlPlane) -> list[str]:
    """SIGKILLs kube-apiserver; returns its command line for :func:`start_apiserver`."""
    proc = _apiserver(cp)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    cp._procs.remove(("kube-apiserver", proc))
    return [str(a) for a in proc.args]


def start_apiserver(cp: ControlPlane, args: list[str]) -> None:
    """Starts kube-apiserver again with the same flags (same port, same etcd) and waits until ready."""
    cp._spawn("kube-apiserver", args)
    cp._wait_healthy("kube-apiserver", f"{cp.url}/readyz", timeout=90)
    revive_components(cp)


def revive_components(cp: ControlPlane) -> None:
    """Restarts a controller-manager or scheduler that exited while the apiserver was away.

    kube-controller-manager exits when, coming back, the apiserver's authorizer is not warm yet; the
    session's control plane must stay whole for the tests after this one.
    """
    for name, proc in list(cp._procs):
        if proc.poll() is None or name not in ("kube-controller-manager", "kube-scheduler"):
            continue
        cp._procs.remove((name, proc))
        args = [str(a) for a in proc.args]  # type: ignore[union-attr]
        cp._spawn(name, args)
        port = next(a.split("=", 1)[1] for a in args if a.startswith("--secure-port="))
        cp._wait_healthy(name, f"https://127.0.0.1:{port}/healthz", timeout=60)


def admin(cp: ControlPlane) -> Kube:
    return cp.client()
