"""Kubelet-less nodes: Node objects that the scheduler treats as Ready.

Nobody runs on them; the scheduler only binds pods. Two things a kubelet normally does are done
here instead: report ``Ready`` with allocatable resources, and get rid of the
``node.kubernetes.io/not-ready`` taint that the TaintNodesByCondition admission plugin adds to
every new Node (the node lifecycle controller, which would remove it, is disabled by the
launcher because it would also mark these nodes unreachable when their lease is never renewed).
"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

from tests.controlplane.kube import ApiError, Kube, Obj

DEFAULT_ALLOCATABLE = {"cpu": "224", "memory": "2Ti", "pods": "110", "ephemeral-storage": "10Ti"}


def node_object(name: str, labels: dict[str, str] | None = None) -> Obj:
    """A plain Node with the labels every node carries; GPU labels come from the caller."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        },
    }


def ready_status(allocatable: dict[str, str] | None = None) -> Obj:
    now = _now()
    resources = {**DEFAULT_ALLOCATABLE, **(allocatable or {})}
    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "fake node (claimscope tests): no kubelet",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
        ],
    }


def register_node(kube: Kube, node: Obj, allocatable: dict[str, str] | None = None) -> Obj:
    """Creates ``node`` (or reuses an existing one), marks it Ready and removes startup taints.

    ``node["status"]``, if present (e.g. from the fleet simulator), is used with its condition
    timestamps moved to now; otherwise a Ready status with ``allocatable`` is written. Taints that
    ``node`` itself declares are kept. Returns the Node as stored.
    """
    body = for_create(node)
    name = body["metadata"]["name"]
    try:
        kube.create(body)
    except ApiError as err:
        if err.code != 409:
            raise
    status = copy.deepcopy(node.get("status")) or ready_status(allocatable)
    now = _now()
    for cond in status.get("conditions", []):
        cond.update({k: now for k in ("lastHeartbeatTime", "lastTransitionTime") if k in cond})
    kube.patch("Node", name, {"status": status}, subresource="status")
    # Merge-patch replaces the whole list: only the caller's own taints survive.
    return kube.patch("Node", name, {"spec": {"taints": body.get("spec", {}).get("taints")}})


def for_create(obj: Obj) -> Obj:
    """A copy of ``obj`` without the fields the server owns (uid, timestamps, status).

    Generated fixtures carry them so that they look like objects read back from a cluster.
    """
    body: dict[str, Any] = copy.deepcopy(obj)
    body.pop("status", None)
    for key in ("uid", "creationTimestamp", "resourceVersion", "generation", "managedFields"):
        body.get("metadata", {}).pop(key, None)
    return body


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
