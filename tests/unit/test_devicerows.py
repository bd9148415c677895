"""Per-pool device rows kept between fleet states (claims.devicerows) compute exactly what a fresh build
computes, and never change what an earlier state holds.

Random slice changes (pools added, removed, republished with new devices or attribute values, a device
name published twice, a newer generation) cross the high-cardinality threshold both ways and renumber the
signature groups. A new seed every run (printed; ``CLAIMSCOPE_ROWS_SEED`` reproduces one); a failing seed is
appended to ``devicerows_seeds.txt`` and runs on every later run.
"""

from __future__ import annotations

import copy
import operator
import os
import random
import secrets
from pathlib import Path
from typing import Any

import pytest

from claims.cel import parse_qualified_name
from claims.devicerows import HIGH_CARDINALITY, DeviceInfo, DeviceRows, Devices, freeze
from tests import seeds

Obj = dict[str, Any]
MODELS = ["NVIDIA B200", "NVIDIA H100 80GB HBM3", "NVIDIA H200"]


def device(rng: random.Random, name: str, serials: int) -> Obj:
    attrs: Obj = {
        "productName": {"string": rng.choice(MODELS)},
        "serial": {"string": f"s-{rng.randrange(serials)}"},  # high-cardinality only when serials is large
        "driverVersion": {"version": rng.choice(["580.1.0", "580.2.0"])},
    }
    if rng.random() < 0.3:
        attrs["profile"] = {"string": rng.choice(["1g.23gb", "3g.90gb"])}
    if rng.random() < 0.2:
        attrs = dict(reversed(list(attrs.items())))  # another layout of the same names
    out: Obj = {
        "name": name,
        "attributes": attrs,
        "capacity": {"memory": {"value": rng.choice(["80Gi", "23Gi"])}},
    }
    if rng.random() < 0.1:
        out["allowMultipleAllocations"] = True
    if "profile" in attrs:  # a MIG device takes its GPU's counters (no draw: kept seeds keep their streams)
        out["consumesCounters"] = [{"counterSet": "gpu-0", "counters": {"memory": {"value": "23Gi"}}}]
    return out


def pool_slices(rng: random.Random, pool: int, generation: int, serials: int) -> list[Obj]:
    count = rng.randint(1, 2)
    out: list[Obj] = []
    for part in range(count):
        names = [f"gpu-{part}-{i}" for i in range(rng.randint(0, 4))]
        if names and rng.random() < 0.05:
            names.append(names[0])  # an invalid pool
        out.append(
            {
                "kind": "ResourceSlice",
                "metadata": {"name": f"node-{pool}-slice-{part}-g{generation}"},
                "spec": {
                    "driver": rng.choice(["gpu.nvidia.com", "gpu.nvidia.com", "other.example.com"]),
                    "pool": {"name": f"node-{pool}", "generation": generation, "resourceSliceCount": count},
                    "nodeName": f"node-{pool}",
                    "devices": [device(rng, n, serials) for n in names],
                },
            }
        )
    driver = out[0]["spec"]["driver"]
    for s in out:
        s["spec"]["driver"] = driver
    return out


def facts(devices: Devices) -> Any:
    return (
        [(i.key, i.sig, i.model, i.profile, id(i.device), i.node) for i in devices.infos],
        [[i.key for i in group] for group in devices.groups],
        devices.high_cardinality,
        devices.published,
        devices.duplicates,
        [(pool, [(i.key, i.sig) for i in infos]) for pool, infos in devices.by_pool.items()],
        devices.pool_groups,
        [[(i.key, id(i.device)) for i in pool] for pool in devices.consumers],
    )


def low_cardinality(info: DeviceInfo, high: frozenset[Any]) -> Any:
    """What a device's signature is made of, written out: equal for the devices of one group."""
    driver = info.key[0]
    attrs = info.device.get("attributes") or {}
    kept = [
        (n, freeze(v))
        for n, v in attrs.items()
        if ("attributes", *parse_qualified_name(n, driver)) not in high
    ]
    caps = [(n, freeze(v)) for n, v in (info.device.get("capacity") or {}).items()]
    return (driver, bool(info.device.get("allowMultipleAllocations")), tuple(kept), tuple(caps))


SEEDS = Path(__file__).with_name("devicerows_seeds.txt")
NEW_SEED = int(os.environ.get("CLAIMSCOPE_ROWS_SEED") or secrets.randbits(32))


@pytest.mark.parametrize("seed", [NEW_SEED, *seeds.kept(SEEDS)])
def test_rows_kept_between_states_compute_what_a_fresh_build_computes(seed: int) -> None:
    print(f"device rows seed {seed}; reproduce with CLAIMSCOPE_ROWS_SEED={seed}")
    with seeds.keeping(SEEDS, seed):
        build_and_compare(seed)


def build_and_compare(seed: int) -> None:
    rng = random.Random(seed)
    serials = rng.choice([HIGH_CARDINALITY // 2, HIGH_CARDINALITY * 4])
    pools: dict[int, list[Obj]] = {p: pool_slices(rng, p, 1, serials) for p in range(12)}
    rows = DeviceRows()
    earlier: list[tuple[Devices, Any]] = []
    reused = 0
    for step in range(60):
        pool = rng.randrange(16)
        move = rng.random()
        if move < 0.15:
            pools.pop(pool, None)
        elif move < 0.3 and pool in pools:
            # a newer generation published beside the old one
            generation = pools[pool][0]["spec"]["pool"]["generation"] + 1
            pools[pool] = pools[pool] + pool_slices(rng, pool, generation, serials)
        elif move < 0.4:
            serials = HIGH_CARDINALITY * 4 if serials < HIGH_CARDINALITY else HIGH_CARDINALITY // 2
            pools[pool] = pool_slices(rng, pool, 1, serials)
        elif move < 0.7 or pool not in pools:
            pools[pool] = pool_slices(rng, pool, 1, serials)
        else:
            changed = copy.deepcopy(pools[pool])  # the same pool, new objects with one value changed
            for s in changed:
                for d in s["spec"]["devices"]:
                    d["attributes"]["driverVersion"] = {"version": "581.0.0"}
            pools[pool] = changed
        slices = [s for p in sorted(pools, key=str) for s in pools[p]]
        rng.shuffle(slices)
        if step % 2:
            rows.interned_limit = 0  # the interned parts are rebuilt from the kept pools on this step
        built_before = rows.built
        kept = rows.devices(slices)
        reused += len(rows.pools) - (rows.built - built_before)
        first = DeviceRows()
        fresh = first.devices(list(slices))
        # A first build guesses the high-cardinality set from the slices: right, so each pool is built once.
        assert first.built == len(first.pools), f"seed {seed}, step {step}"
        assert facts(kept) == facts(fresh), f"seed {seed}, step {step}"
        # Each pool's list is its devices, and a device is found by its key in it.
        assert [i for infos in kept.by_pool.values() for i in infos] == kept.infos
        for info in rng.sample(kept.infos, min(5, len(kept.infos))):
            same = [i for i in kept.by_pool[info.key[:2]] if i.key == info.key]
            if len(same) > 1:  # a name published twice makes the pool invalid (recorded)
                assert info.key[:2] in {p for p, _ in kept.duplicates}, f"seed {seed}, step {step}"
            assert kept.find(info.key) is same[0], f"seed {seed}, step {step}"
        assert kept.find(("gpu.nvidia.com", "node-99", "gpu-0-0")) is None
        # The groups kept per pool are those of the devices the state lists.
        walked: dict[tuple[str, str], set[tuple[str, str]]] = {}
        for info in kept.infos:
            walked.setdefault(info.key[:2], set()).add((info.model, info.profile))
        assert kept.pool_groups == {p: frozenset(g) for p, g in walked.items()}, f"seed {seed}, step {step}"
        # The groups are the signatures: devices agreeing on every low-cardinality attribute (in their
        # order) and capacity share one group, and no other device is in it.
        sig_of: dict[Any, int] = {}
        for info in kept.infos:
            signature = sig_of.setdefault(low_cardinality(info, kept.high_cardinality), info.sig)
            assert signature == info.sig, f"seed {seed}, step {step}: one signature, two groups"
        assert len(set(sig_of.values())) == len(sig_of), (
            f"seed {seed}, step {step}: two signatures, one group"
        )
        for sig, group in enumerate(kept.groups):
            assert group and all(i.sig == sig for i in group), f"seed {seed}, step {step}"
        # The counter consumers are the state's devices (the objects it lists) that consume counters
        # and are never shared.
        consumers = [
            i
            for i in kept.infos
            if i.device.get("consumesCounters") and not i.device.get("allowMultipleAllocations")
        ]
        listed = [i for pool in kept.consumers for i in pool]
        assert len(listed) == len(consumers), f"seed {seed}, step {step}"
        assert all(map(operator.is_, listed, consumers)), f"seed {seed}, step {step}"
        earlier.append((kept, facts(kept)))
        for devices, seen in earlier:
            assert facts(devices) == seen, f"seed {seed}, step {step}: an earlier state's devices changed"
    assert reused > 0, f"seed {seed}: no pool's rows were ever reused"
