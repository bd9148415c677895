"""``oldest`` picks what sorting every holder by age would, without the full sort."""

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
    return {"metadata": meta}


@pytest.mark.parametrize("seed", [NEW_SEED, *seeds.kept(SEEDS)])
def test_oldest_is_the_head_of_the_holders_sorted_by_age(seed: int) -> None:
    print(f"oldest holders seed: {seed}")
    rng = random.Random(seed)
    with seeds.keeping(SEEDS, seed):
        for _ in range(200):
            claims = [claim(rng, i) for i in range(rng.randint(0, 60))]
            n = rng.choice([0, 1, 3, 20])
            assert oldest(claims, n) == sorted(claims, key=age_key)[:n], (seed, n)


def test_oldest_keeps_every_claim_of_a_tied_creation_time_in_the_running() -> None:
    # The bound (the 2nd oldest time) is shared by three claims: the one first by name must win.
    claims = [
        {"metadata": {"name": n, "namespace": "ml", "creationTimestamp": t}}
        for n, t in [("z", "2026-01-02"), ("c", "2026-01-01"), ("y", "2026-01-02"), ("b", "2026-01-02")]
    ]
    assert [c["metadata"]["name"] for c in oldest(claims, 2)] == ["c", "b"]
