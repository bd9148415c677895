"""The fleet's own kinds: nodes, device classes, ResourceSlices and their devices, DeviceTaintRules."""

from __future__ import annotations

from typing import Any

from fleet import counts
from fleet.ingest import rule_taints
from fleet.ingest.specs import ChildSpec, TableSpec, register
from fleet.models import Device, DeviceClass, DeviceTaintRule, Node, ResourceSlice
from fleet.normalize import DeviceClassRecord, DeviceTaintRuleRecord, NodeRecord, SliceRecord


def _node_row(r: NodeRecord) -> dict[str, Any]:
    return {
        "ready": r.ready,
        "unschedulable": r.unschedulable,
        "gpu_product": r.gpu_product,
        "clique": r.clique,
    }


def _class_row(r: DeviceClassRecord) -> dict[str, Any]:
    return {"selectors": r.selectors, "extended_resource_name": r.extended_resource_name}


def _rule_row(r: DeviceTaintRuleRecord) -> dict[str, Any]:
    return {"selector": r.selector, "taint": r.taint, "effect": str(r.taint.get("effect", ""))}


def _slice_row(r: SliceRecord) -> dict[str, Any]:
    return {
        "driver": r.driver,
        "pool": r.pool,
        "pool_generation": r.pool_generation,
        "pool_slice_count": r.pool_slice_count,
        "node_name": r.node_name,
        "all_nodes": r.all_nodes,
        "per_device_node_selection": r.per_device_node_selection,
        "shared_counters": r.shared_counters,
        "device_count": len(r.devices),
    }


def _device_rows(r: SliceRecord) -> list[dict[str, Any]]:
    return [
        {
            "driver": r.driver,
            "pool": r.pool,
            "name": d.name,
            "slice_name": r.meta.name,
            "pool_generation": r.pool_generation,
            "node_name": d.node_name,
            "kind": d.kind,
            "model": d.model,
            "product_name": d.product_name,
            "uuid": d.uuid,
            "parent_uuid": d.parent_uuid,
            "gpu_uuid": d.gpu_uuid,
            "gpu_minor": d.gpu_minor,
            "mig_profile": d.mig_profile,
            "compute_slices": d.compute_slices,
            "memory_bytes": d.memory_bytes,
            "taints": d.taints,
            "tainted": counts.is_tainted(d.taints),
            "counters_consumed": d.counters_consumed,
            "attributes": d.attributes,
            "capacity": d.capacity,
        }
        for d in r.devices
    ]


register("Node", TableSpec(Node, ("name",), _node_row))
register("DeviceClass", TableSpec(DeviceClass, ("name",), _class_row))
register(
    "ResourceSlice",
    TableSpec(
        ResourceSlice,
        ("name",),
        _slice_row,
        children=(
            ChildSpec(
                Device,
                parent_column="slice_name",
                parent_field="name",
                parent_value=lambda r: r.meta.name,
                rows=_device_rows,
                conflict=("driver", "pool", "name"),
                fence="pool_generation",
            ),
        ),
    ),
)
# A rule's writes and deletes re-taint the devices it selected or selects (fleet.ingest.rule_taints).
register(
    "DeviceTaintRule",
    TableSpec(
        DeviceTaintRule,
        ("name",),
        _rule_row,
        on_written=rule_taints.rules_changed,
        on_deleted=rule_taints.rules_changed,
    ),
)
