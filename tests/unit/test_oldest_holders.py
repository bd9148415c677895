"""The holders a diagnosis shows are what sorting them by age would pick: ``oldest`` from their age keys
without the full sort, and ``Context.holders_of`` either that way or from the state's holders in age order."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from claims.diagnosis import groups
from claims.diagnosis.groups import HOLDERS_SHOWN, Context, CountersLeft, Group, Summary, oldest
from claims.fleetstate import FleetState, HoldersByAge, age_key, unreserved
from tests import seeds

SEEDS = Path(__file__).with_name("oldest_holders_seeds.txt")
NEW_SEED = random.SystemRandom().randrange(2**32)


def claim(rng: random.Random, i: int) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"c{rng.randrange(50)}-{i}"}
    if rng.random() < 0.9:  # few distinct times: ties broken by namespace/name
        meta["creationTimestamp"] = f"2026-01-0{rng.randint(1, 3)}T00:00:0{rng.randint(0, 2)}Z"
    if rng.random() < 0.8:  # cluster-scoped keys ("name") sort among "namespace/name" ones
        meta["namespace"] = rng.choice(["a", "a-b", "team", "z"])
    if rng.random() < 0.5:
        return {"metadata": meta, "status": {"reservedFor": [{"name": "p"}]}}
    return {"metadata": meta}


@pytest.mark.parametrize("seed", [NEW_SEED, *seeds.kept(SEEDS)])
def test_oldest_is_the_head_of_the_holders_sorted_by_age(seed: int) -> None:
    print(f"oldest holders seed: {seed}")
    rng = random.Random(seed)
    with seeds.keeping(SEEDS, seed):
        for _ in range(200):
            claims = [claim(rng, i) for i in range(rng.randint(0, 60))]
            if claims and rng.random() < 0.3:
                claims.append(dict(claims[0]))  # equal keys: the earlier one first, as a stable sort
            keys = [age_key(c) for c in claims]
            n = rng.choice([0, 1, 3, 20])
            # By identity: of two equal claims, the one a stable sort puts first.
            picked = [id(c) for c in oldest(claims, keys, n)]
            assert picked == [id(c) for c in sorted(claims, key=age_key)[:n]], (seed, n)
            free = [c for c in claims if unreserved(c)]
            picked = [id(c) for c in oldest(claims, keys, n, only=map(unreserved, claims))]
            assert picked == [id(c) for c in sorted(free, key=age_key)[:n]], (seed, n)


@pytest.mark.parametrize("seed", [NEW_SEED, *seeds.kept(SEEDS)])
@pytest.mark.parametrize("sparse", [0, 10**9], ids=["sorted-alone", "walked-in-state-order"])
def test_a_groups_holders_shown_are_the_head_of_its_holders_sorted_by_age(
    seed: int, sparse: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both ways Context.holders_of picks them: ordering the groups' holders alone, or walking the state's
    # holders in age order (HoldersByAge) for the groups' ones.
    monkeypatch.setattr(groups, "SPARSE_HOLDERS", sparse)
    print(f"oldest holders seed: {seed}")
    rng = random.Random(seed)
    with seeds.keeping(SEEDS, seed):
        for _ in range(100):
            claims = [claim(rng, i) for i in range(rng.randint(0, 60))]  # one fleet: names differ
            holders: dict[Any, list[dict[str, Any]]] = {}
            for c in claims:
                for _ in range(rng.randint(1, 2)):
                    holders.setdefault(("d", "p", f"dev-{rng.randrange(40)}"), []).append(c)
            state = FleetState()
            state._holders = holders
            ctx = Context(state, {}, CountersLeft({}, {}))
            sources = [
                Summary(holders={id(c): c for c in rng.sample(claims, rng.randint(0, len(claims)))})
                for _ in range(rng.randint(0, 4))
            ]
            held = ctx.holders_of([Group("m", "", sources=sources)])
            union = {i: c for s in sources for i, c in s.holders.items()}
            assert held.every == union, seed
            by_age = sorted(union.values(), key=age_key)
            assert [id(c) for c in held.oldest] == [id(c) for c in by_age[:HOLDERS_SHOWN]], seed
            free = [c for c in by_age if unreserved(c)][:HOLDERS_SHOWN]
            assert [id(c) for c in held.unreserved] == [id(c) for c in free], seed


def test_a_holder_missing_from_the_states_order_is_still_shown(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A kept order out of step with the holders must not show fewer holders than there are.
    monkeypatch.setattr(groups, "SPARSE_HOLDERS", 10**9)  # the walk of the state's order
    claims = [{"metadata": {"namespace": "team", "name": f"c{i}"}} for i in range(3)]
    state = FleetState(cluster="one")
    state._holders = {("d", "p", f"dev-{i}"): [c] for i, c in enumerate(claims)}
    state._by_age = HoldersByAge(claims[1:], claims[1:])  # c0, the oldest, is missing
    held = Context(state, {}, CountersLeft({}, {})).holders_of(
        [Group("m", "", sources=[Summary(holders={id(c): c for c in claims})])]
    )
    assert [c["metadata"]["name"] for c in held.oldest] == ["c0", "c1", "c2"]
    assert [c["metadata"]["name"] for c in held.unreserved] == ["c0", "c1", "c2"]
    assert "holders by age of cluster 'one' miss some of 3 holders" in caplog.text
