"""How the namespaced kinds (claims, templates, pods, events) are stored: registered when ``fleet.ingest``
loads. The analysis hooks claim batches (``claims.history``): :func:`set_claim_hooks`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from fleet.ingest.specs import SPECS, ChildSpec, TableSpec, register
from fleet.models import (
    Cluster,
    DeviceAllocation,
    Pod,
    PodClaimUse,
    ResourceClaim,
    ResourceClaimTemplate,
    SchedulingEvent,
)
from fleet.normalize import ClaimRecord, EventRecord, PodRecord, TemplateRecord

NAMESPACED = ("namespace", "name")


def _claim_row(r: ClaimRecord) -> dict[str, Any]:
    return {
        "state": r.state,
        "requests": [req.as_dict() for req in r.spec.requests],
        "constraints": r.spec.constraints,
        "reserved_for": r.reserved_for,
        "node_name": r.node_name,
        "owner_pod_uid": r.owner_pod_uid,
        "owner_pod_name": r.owner_pod_name,
        "pod_claim_name": r.pod_claim_name,
        "allocated_at": r.allocated_at,
        "deleted_at": r.meta.deleted_at,
    }


def _allocation_rows(r: ClaimRecord) -> list[dict[str, Any]]:
    return [
        {
            "claim_uid": r.meta.uid,
            "request": a.request,
            "driver": a.driver,
            "pool": a.pool,
            "device_name": a.device,
            "admin_access": a.admin_access,
            "share_id": a.share_id,
            "consumed_capacity": a.consumed_capacity,
        }
        for a in r.allocations
    ]


def _template_row(r: TemplateRecord) -> dict[str, Any]:
    return {"requests": [req.as_dict() for req in r.spec.requests], "constraints": r.spec.constraints}


def _pod_row(r: PodRecord) -> dict[str, Any]:
    return {
        "phase": r.phase,
        "node_name": r.node_name,
        "scheduled_status": r.scheduled_status,
        "scheduled_reason": r.scheduled_reason,
        "scheduled_message": r.scheduled_message,
        "scheduled_at": r.scheduled_at,
        "claim_refs": r.claim_refs,
        "claim_statuses": r.claim_statuses,
        "gpu_requests": r.gpu_requests,
    }


def _claim_use_rows(r: PodRecord) -> list[dict[str, Any]]:
    return [
        {"pod_uid": r.meta.uid, "namespace": r.meta.namespace, "claim_name": name}
        for name in sorted(r.claim_names())
    ]


def _event_row(r: EventRecord) -> dict[str, Any]:
    return {
        "reason": r.reason,
        "type": r.type,
        "message": r.message,
        "involved_kind": r.involved_kind,
        "involved_namespace": r.involved_namespace,
        "involved_name": r.involved_name,
        "involved_uid": r.involved_uid,
        "count": r.count,
        "first_at": r.first_at,
        "last_at": r.last_at,
    }


def _register_all() -> None:
    register(
        "ResourceClaim",
        TableSpec(
            ResourceClaim,
            NAMESPACED,
            _claim_row,
            children=(
                ChildSpec(
                    DeviceAllocation,
                    parent_column="claim_uid",
                    parent_field="uid",
                    parent_value=lambda r: r.meta.uid,
                    rows=_allocation_rows,
                    conflict=("claim_uid", "request", "driver", "pool", "device_name", "share_id"),
                ),
            ),
        ),
    )
    register("ResourceClaimTemplate", TableSpec(ResourceClaimTemplate, NAMESPACED, _template_row))
    register(
        "Pod",
        TableSpec(
            Pod,
            NAMESPACED,
            _pod_row,
            children=(
                ChildSpec(
                    PodClaimUse,
                    parent_column="pod_uid",
                    parent_field="uid",
                    parent_value=lambda r: r.meta.uid,
                    rows=_claim_use_rows,
                    conflict=("pod_uid", "claim_name"),
                ),
            ),
        ),
    )
    register("Event", TableSpec(SchedulingEvent, NAMESPACED, _event_row))


_register_all()


def set_claim_hooks(
    on_written: Callable[[Cluster, list[Any], datetime], None],
    on_deleted: Callable[[Cluster, list[tuple[str, datetime | None]], datetime], None],
) -> None:
    """Call ``on_written``/``on_deleted`` in every claim batch's transaction (see ``TableSpec``): the analysis
    records each state change of a claim without the mirror importing it."""
    register("ResourceClaim", replace(SPECS["ResourceClaim"], on_written=on_written, on_deleted=on_deleted))
