"""``oldest`` picks what sorting the holders by age would, from their age keys, without the full sort."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from claims.diagnosis.groups import age_key, oldest
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


def unreserved(c: dict[str, Any]) -> bool:
    return not (c.get("status") or {}).get("reservedFor")


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
