"""Fleet specs for the simulator: pools of identical GPU nodes, presets, and object generation.

A spec is plain data (a dict or YAML file), e.g.:

    name: small
    seed: 7
    pools:
      - {name: b200, model: B200, nodes: 2, mode: full, clique_size: 2, compute_domain: true}
      - {name: h100-mig, model: H100, nodes: 1, mode: static-mig, layout: mixed}
      - {name: h100-dyn, model: H100, nodes: 1, mode: dynamic-mig}
      - {name: b300, model: B300, nodes: 1, taint_rate: 0.05}

`build_fleet(spec)` turns it into Node, ResourceSlice and DeviceClass dicts through `simulator.nvidia`. The
output is a pure function of the spec (the seed drives the "random" layout and which GPUs get health taints).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from simulator import nvidia as nv

Obj = dict[str, Any]

MODES = ("full", "static-mig", "dynamic-mig")


@dataclass(frozen=True)
class PoolSpec:
    """A group of identical nodes. `layout` applies to static MIG ("random" picks per GPU from the seed)."""

    name: str
    model: str
    nodes: int
    mode: str = "full"
    layout: str | None = None
    gpus: int = 8
    clique_size: int = 0  # >0: nodes get `nvidia.com/gpu.clique` labels, this many nodes per clique
    compute_domain: bool = False  # publish the compute-domain.nvidia.com slice on every node
    taint_rate: float = 0.0  # fraction of GPUs with an XID 79 NoSchedule taint
    split: bool = True  # DynamicMIG: ≥1.35 split slices

    def __post_init__(self) -> None:
        if self.model not in nv.MODELS:
            raise ValueError(f"pool {self.name}: unknown model {self.model!r} (known: {sorted(nv.MODELS)})")
        if self.mode not in MODES:
            raise ValueError(f"pool {self.name}: mode must be one of {MODES}")
        if self.nodes < 0 or self.gpus < 1:
            raise ValueError(f"pool {self.name}: nodes must be >= 0 and gpus >= 1")

    def node_name(self, index: int) -> str:
        return f"{self.name}-{index:04d}"


@dataclass(frozen=True)
class FleetSpec:
    name: str
    pools: tuple[PoolSpec, ...]
    seed: int = 0
    created: str = "2026-03-02T08:00:00Z"

    @property
    def node_count(self) -> int:
        return sum(p.nodes for p in self.pools)

    @property
    def gpu_count(self) -> int:
        return sum(p.nodes * p.gpus for p in self.pools)


def spec_from_dict(data: Mapping[str, Any]) -> FleetSpec:
    """Build a FleetSpec from plain data (as loaded from YAML). Unknown keys are an error, not ignored."""
    pools = []
    for raw in data.get("pools", []):
        pools.append(PoolSpec(**dict(raw)))
    extra = set(data) - {"name", "seed", "pools", "created"}
    if extra:
        raise ValueError(f"unknown fleet spec keys: {sorted(extra)}")
    return FleetSpec(
        name=str(data.get("name", "custom")),
        pools=tuple(pools),
        seed=int(data.get("seed", 0)),
        created=str(data.get("created", FleetSpec.created)),
    )


def load_spec(path: str | Path) -> FleetSpec:
    with open(path) as f:
        return spec_from_dict(yaml.safe_load(f))


def preset(name: str, seed: int = 0) -> FleetSpec:
    """One of "small" (6 nodes), "medium" (200 nodes), "L" (5,000 nodes x 8 GPUs = 40,000 GPUs), "XL" (15,000
    nodes, 120,000 GPUs, ~1.06M devices: 30 % of the GPUs in dynamic-MIG mode publish 26 devices each)."""
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return spec_from_dict({**PRESETS[name], "seed": seed})


def _scaled(total: int, shares: list[tuple[Obj, float]], name: str) -> Obj:
    """Pools whose node counts are `share * total`, with rounding drift put on the first pool."""
    pools = [{**p, "nodes": int(total * s)} for p, s in shares]
    pools[0]["nodes"] += total - sum(p["nodes"] for p in pools)
    return {"name": name, "pools": pools}


_MIX: list[tuple[Obj, float]] = [
    ({"name": "b200", "model": "B200", "clique_size": 4, "compute_domain": True, "taint_rate": 0.002}, 0.36),
    ({"name": "b300", "model": "B300", "clique_size": 4, "compute_domain": True, "taint_rate": 0.002}, 0.16),
    ({"name": "h100", "model": "H100", "taint_rate": 0.003}, 0.14),
    ({"name": "h100-mig", "model": "H100", "mode": "static-mig", "layout": "mixed"}, 0.10),
    ({"name": "h100-dyn", "model": "H100", "mode": "dynamic-mig"}, 0.04),
    ({"name": "h200", "model": "H200", "taint_rate": 0.002}, 0.12),
    ({"name": "h200-mig", "model": "H200", "mode": "static-mig", "layout": "random"}, 0.08),
]

# The XL fleet: a 15,000-node fleet where dynamic MIG dominates the device count (36,000 GPUs x 26 partitions
# = 936,000 of ~1.06M devices), as on a fleet that repartitions on demand.
_XL_MIX: list[tuple[Obj, float]] = [
    ({"name": "b200", "model": "B200", "clique_size": 4, "compute_domain": True, "taint_rate": 0.002}, 0.30),
    ({"name": "b300", "model": "B300", "clique_size": 4, "compute_domain": True, "taint_rate": 0.002}, 0.15),
    ({"name": "h100-dyn", "model": "H100", "mode": "dynamic-mig"}, 0.20),
    ({"name": "h200-dyn", "model": "H200", "mode": "dynamic-mig"}, 0.10),
    ({"name": "h100-mig", "model": "H100", "mode": "static-mig", "layout": "mixed"}, 0.10),
    ({"name": "h200", "model": "H200", "taint_rate": 0.002}, 0.15),
]

PRESETS: dict[str, Obj] = {
    "small": {
        "name": "small",
        "pools": [
            {"name": "b200", "model": "B200", "nodes": 2, "clique_size": 2, "compute_domain": True},
            {
                "name": "h100-mig",
                "model": "H100",
                "nodes": 1,
                "mode": "static-mig",
                "layout": "balanced,all-1g",
            },
            {"name": "h200-mig", "model": "H200", "nodes": 1, "mode": "static-mig", "layout": "all-3g"},
            {"name": "b300", "model": "B300", "nodes": 1},
            {"name": "h100-dyn", "model": "H100", "nodes": 1, "mode": "dynamic-mig"},
        ],
    },
    "medium": _scaled(200, _MIX, "medium"),
    "L": _scaled(5000, _MIX, "L"),
    "XL": _scaled(15000, _XL_MIX, "XL"),
}


@dataclass
class Fleet:
    """The cluster-scoped objects of a fleet, in creation order."""

    spec: FleetSpec
    nodes: list[Obj] = field(default_factory=list)
    slices: list[Obj] = field(default_factory=list)
    device_classes: list[Obj] = field(default_factory=list)

    def objects(self) -> Iterator[Obj]:
        yield from self.device_classes
        yield from self.nodes
        yield from self.slices

    def physical_gpus(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.spec.pools:
            out[p.model] = out.get(p.model, 0) + p.nodes * p.gpus
        return out


def _layout(pool: PoolSpec, rng: random.Random) -> str | None:
    if pool.mode != "static-mig" or pool.layout != "random":
        return pool.layout
    choices = sorted(nv.LAYOUTS)
    return ",".join(rng.choice(choices) for _ in range(pool.gpus))


def build_fleet(spec: FleetSpec) -> Fleet:
    """Generate every Node / ResourceSlice / DeviceClass of `spec`; same spec and seed, same objects."""
    fleet = Fleet(spec=spec, device_classes=nv.device_classes(created=spec.created))
    for pool in spec.pools:
        # One RNG per pool so that resizing one pool does not reshuffle the others.
        rng = random.Random(f"{spec.seed}/{pool.name}")
        for i in range(pool.nodes):
            name = pool.node_name(i)
            clique = f"{spec.name}-{pool.name}.{i // pool.clique_size}" if pool.clique_size else None
            fleet.nodes.append(
                nv.node_object(name, pool.model, clique=clique, gpus=pool.gpus, created=spec.created)
            )
            taints: dict[int, list[dict[str, Any]]] = {}
            if pool.taint_rate:
                for g in range(pool.gpus):
                    if rng.random() < pool.taint_rate:
                        taints[g] = [
                            {
                                "key": "gpu.nvidia.com/xid",
                                "value": "79",
                                "effect": "NoSchedule",
                                "timeAdded": spec.created,
                            }
                        ]
            fleet.slices += nv.node_slices(
                name,
                pool.model,
                mode=pool.mode,
                layout=_layout(pool, rng),
                gpus=pool.gpus,
                split=pool.split,
                taints=taints or None,
                created=spec.created,
            )
            if pool.compute_domain:
                fleet.slices.append(nv.compute_domain_slice(name, created=spec.created))
    return fleet
