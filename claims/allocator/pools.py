"""Resource pools as the allocator sees them from one node: slices of a pool's highest generation only, a
pool with fewer slices than ``resourceSliceCount`` is incomplete, duplicate devices and unknown counter
sets make it invalid (``buildPool``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from claims.allocator.nodes import node_matches, obj_name
from claims.allocator.snapshot import Features, FleetSnapshot, Obj, slice_index, slice_key
from fleet.quantity import parse_quantity


@dataclass
class Pool:
    driver: str
    name: str
    slices: list[Obj] = field(default_factory=list)  # device slices targeting the node, sorted by name
    counters: dict[str, dict[str, Fraction]] = field(default_factory=dict)
    incomplete: bool = False
    invalid: str = ""

    @property
    def pool_id(self) -> str:
        return f"{self.driver}/{self.name}"


def generation(s: Obj) -> int:
    """A slice's pool generation."""
    return int(((s.get("spec") or {}).get("pool") or {}).get("generation", 0))


def qty(value: Any) -> Fraction:
    return parse_quantity(str(value)).value


def gather_pools(node: Obj, snapshot: FleetSnapshot, features: Features) -> list[Pool]:
    by_pool: dict[tuple[str, str], list[Obj]] = {}
    index = slice_index(snapshot)
    for s in [*index.by_node.get(obj_name(node), []), *index.other]:
        spec = s.get("spec") or {}
        if not features.partitionable_devices and (
            spec.get("perDeviceNodeSelection") or spec.get("sharedCounters")
        ):
            continue
        if spec.get("nodeName") or spec.get("allNodes") or spec.get("nodeSelector") is not None:
            relevant = node_matches(
                node, spec.get("nodeName", ""), bool(spec.get("allNodes")), spec.get("nodeSelector")
            )
        elif spec.get("perDeviceNodeSelection"):
            relevant = any(device_on_node(node, d) for d in spec.get("devices") or [])
        else:
            continue
        if not relevant:
            continue
        current = by_pool.get(slice_key(s))
        if current is None or generation(s) > generation(current[0]):
            by_pool[slice_key(s)] = [s]
        elif generation(s) == generation(current[0]):
            current.append(s)
    pools: list[Pool] = []
    for (driver, pool_name), slices in by_pool.items():
        newest = generation(slices[0])
        count = int(((slices[0].get("spec") or {}).get("pool") or {}).get("resourceSliceCount", 1))
        if len(slices) == count:
            # Complete from this node's view: upstream uses it as is, without looking for a newer
            # generation elsewhere (a pool moving between nodes stays usable on the old one until
            # its slices there are gone).
            pools.append(_build_pool(driver, pool_name, slices, slices, features))
            continue
        all_for_pool = index.by_pool.get((driver, pool_name), [])
        if any(generation(s) > newest for s in all_for_pool):
            continue  # obsolete: a newer generation exists elsewhere
        at_generation = [s for s in all_for_pool if generation(s) == newest]
        if len(at_generation) != count:
            pools.append(Pool(driver, pool_name, incomplete=True))
            continue
        pools.append(_build_pool(driver, pool_name, slices, at_generation, features))
    # Pools with a device that has binding conditions come last (then by id), so a first-fit search
    # prefers devices usable without waiting for a binding controller (pools_incubating.go).
    pools.sort(key=lambda p: (has_binding_conditions(p), p.driver, p.name))
    return pools


def has_binding_conditions(pool: Pool) -> bool:
    """Whether a device of the pool's slices targeting the node has ``bindingConditions``."""
    return any(
        d.get("bindingConditions") is not None
        for s in pool.slices
        for d in (s.get("spec") or {}).get("devices") or []
    )


def device_on_node(node: Obj, device: Obj) -> bool:
    return node_matches(
        node, device.get("nodeName", ""), bool(device.get("allNodes")), device.get("nodeSelector")
    )


def _build_pool(driver: str, name: str, slices: list[Obj], all_slices: list[Obj], features: Features) -> Pool:
    pool = Pool(driver, name)
    pool.slices = sorted(
        (
            s
            for s in slices
            if not (features.partitionable_devices and (s.get("spec") or {}).get("sharedCounters"))
        ),
        key=obj_name,
    )
    seen: set[str] = set()
    for s in pool.slices:
        for device in (s.get("spec") or {}).get("devices") or []:
            if device.get("name") in seen:
                pool.invalid = f"duplicate device name {device.get('name')}"
                return pool
            seen.add(device.get("name", ""))
    for s in all_slices:
        for counter_set in (s.get("spec") or {}).get("sharedCounters") or []:
            pool.counters[counter_set.get("name", "")] = {
                k: qty((v or {}).get("value", "0")) for k, v in (counter_set.get("counters") or {}).items()
            }
    for s in pool.slices:
        for device in (s.get("spec") or {}).get("devices") or []:
            for consumption in device.get("consumesCounters") or []:
                known = pool.counters.get(consumption.get("counterSet", ""))
                if known is None or any(c not in known for c in consumption.get("counters") or {}):
                    pool.invalid = f"device {device.get('name')} consumes unknown counters"
                    return pool
    return pool
