"""A summary of a batch of devices (``analysis.summarize``, which lets the commonest devices skip the
per-device call) counts what each device's ``_state_outcome`` says, in the same order."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from claims.diagnosis.analysis import _state_outcome, summarize
from claims.diagnosis.groups import Context, Group, Summary
from claims.diagnosis.requests import Req
from claims.diagnosis.result import CAPACITY, FREE, SELECTOR
from claims.fleetstate import DeviceInfo, DeviceKey, FleetState
from fleet.quantity import parse_quantity
from simulator import nvidia
from tests import seeds

SEEDS = Path(__file__).with_name("summaries_seeds.txt")
NEW_SEED = random.SystemRandom().randrange(2**32)
Obj = dict[str, Any]
TAINT = {"key": "maintenance", "value": "x", "effect": "NoSchedule"}


def by_definition(
    ctx: Context, req: Req, batch: list[DeviceInfo], holders: dict[DeviceKey, list[Obj]]
) -> Summary:
    summary = Summary()
    scratch = Group("", "")
    for info in batch:
        result = _state_outcome(ctx, req, info, scratch, holders)
        summary.outcomes[result] = summary.outcomes.get(result, 0) + 1
        if result not in (SELECTOR, CAPACITY):
            summary.candidate_nodes.add(info.node)
        if result == FREE:
            summary.free.append(info)
            summary.free_nodes[info.node] = summary.free_nodes.get(info.node, 0) + 1
    summary.taints, summary.holders, summary.pool_problems = (
        scratch.taints,
        scratch.holders,
        scratch.pool_problems,
    )
    return summary


def fleet(rng: random.Random) -> FleetState:
    objs: list[Obj] = list(nvidia.device_classes())
    for n in range(rng.randint(1, 4)):
        name, mode = f"n{n}", rng.choice(["full", "dynamic-mig", "static-mig"])
        gpus = rng.randint(1, 3)
        taints = {i: [TAINT] for i in range(gpus) if rng.random() < 0.3}
        parts = nvidia.node_slices(name, "H100", mode=mode, gpus=gpus, taints=taints)
        if rng.random() < 0.2:  # a slice missing: the pool is incomplete
            parts[0]["spec"]["pool"]["resourceSliceCount"] += 1
        for s in parts:
            for d in s["spec"].get("devices") or []:
                if rng.random() < 0.2:
                    d["allowMultipleAllocations"] = True
        objs += [nvidia.node_object(name, "H100", gpus=gpus), *parts]
    devices = FleetState.from_objects(objs).devices()
    for i in range(rng.randint(0, len(devices))):
        info = rng.choice(devices)
        result: Obj = {"request": "gpu", "driver": info.key[0], "pool": info.key[1], "device": info.key[2]}
        if info.device.get("allowMultipleAllocations") and rng.random() < 0.7:
            result["shareID"] = f"share-{i}"
            if rng.random() < 0.7:  # else a share that consumes nothing: the device stays free
                result["consumedCapacity"] = {"memory": rng.choice(["0", "10Gi", "80Gi"])}
        if rng.random() < 0.1:
            result["adminAccess"] = True
        pods = [] if rng.random() < 0.3 else [{"resource": "pods", "name": f"p{i}", "uid": f"u{i}"}]
        status = nvidia.allocation_status([result], info.node or "n0", pods)
        status["allocation"]["devices"]["results"] = [result]  # with its share, which the helper drops
        claim = nvidia.claim_object("team", f"held-{i}", [], status=status)
        objs.append({**claim, "kind": "ResourceClaim"})
    return FleetState.from_objects(objs)


@pytest.mark.parametrize("seed", [NEW_SEED, *seeds.kept(SEEDS)])
def test_a_summary_counts_each_devices_state_outcome(seed: int) -> None:
    print(f"summaries seed: {seed}")
    rng = random.Random(seed)
    requests = [
        Req("", "", {}, "", 1, False, [], [], [], {}),
        Req("", "", {}, "", 1, False, [], [], [{"operator": "Exists"}], {}),
        Req("", "", {}, "", 1, False, [], [], [], {}, admin=True),
        Req("", "", {}, "", 1, False, [], [], [], {"memory": parse_quantity("20Gi").value}),
    ]
    with seeds.keeping(SEEDS, seed):
        for _ in range(20):
            state = fleet(rng)
            ctx, holders = Context.of(state), state.holders()
            for req in requests:
                for batch in state.signature_groups():
                    got, want = summarize(ctx, req, batch, holders), by_definition(ctx, req, batch, holders)
                    for part in ("outcomes", "free_nodes", "taints", "holders"):
                        assert list(getattr(got, part).items()) == list(getattr(want, part).items()), part
                    assert (got.pool_problems, got.candidate_nodes) == (
                        want.pool_problems,
                        want.candidate_nodes,
                    )
                    assert got.free == want.free
