"""What the monday scenario constructs, derived from its own definitions (fleet spec and workloads), never
from the page: the expected cause groups of the pending page."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from claims.causes import plain_selector
from fleet.quantity import parse_quantity
from simulator import scenarios
from simulator.spec import build_fleet, spec_from_dict
from simulator.workloads import Workload, memory_at_least, profile_is

# The engine's category for each kind of broken workload the scenario builds (workloads.broken): a selector
# reading an attribute no device publishes fails at runtime ("no such key"), 400Gi matches no device.
BROKEN_CATEGORY = {
    "broken-cel": "cel-error",
    "unknown-attribute": "cel-error",
    "impossible-memory": "no-match",
}
BIG = memory_at_least("150Gi")


@dataclass(frozen=True)
class Expected:
    groups: list[tuple[str, int]]  # (category, count), in any order
    big_pending: int
    big_devices: int
    one_g_pending: int
    idle_three_g: int
    namespaces: dict[str, int]  # pending claims per namespace


def _devices(seed: int) -> list[dict]:
    fleet = build_fleet(spec_from_dict({**scenarios.MONDAY_FLEET, "seed": seed}))
    return [d for s in fleet.slices for d in s["spec"].get("devices") or []]


def _selectors(w: Workload) -> list[str]:
    return [
        s["cel"]["expression"] for r in w.requests for s in (r.get("exactly") or {}).get("selectors") or []
    ]


def _count(w: Workload) -> int:
    return sum(int((r.get("exactly") or {}).get("count", 1)) for r in w.requests) * w.pods


def _pending_after_greedy(workloads: list[Workload], capacity: int) -> list[Workload]:
    """First come, first served on ``capacity`` interchangeable devices until Monday 09:00 (jobs that end
    before then give theirs back): the ones never placed."""
    running: list[tuple[datetime, int]] = []
    pending = []
    for w in sorted(workloads, key=lambda w: (w.arrival, w.name)):
        running = [(end, n) for end, n in running if end > w.arrival]
        used = sum(n for _, n in running)
        if used + _count(w) <= capacity:
            end = w.arrival + w.duration if w.duration else scenarios.MONDAY_09
            running.append((end, _count(w)))
        else:
            pending.append(w)
    return pending


def expected_monday(seed: int = 0) -> Expected:
    workloads = scenarios.monday_workloads(seed)
    devices = _devices(seed)
    # Devices with >= 150Gi of memory (whole GPUs): what the big-memory jobs can use.
    big_devices = sum(
        1
        for d in devices
        if "memory" in (d.get("capacity") or {})
        and parse_quantity(str(d["capacity"]["memory"]["value"])).value >= parse_quantity("150Gi").value
    )
    big = _pending_after_greedy([w for w in workloads if BIG in _selectors(w)], big_devices)

    def static_slices(profile: str) -> int:
        # Statically partitioned slices (dynamic MIG partitions consume counters and are blocked here:
        # the full-GPU H100 job holds every GPU of the DynamicMIG node all weekend).
        return sum(
            1
            for d in devices
            if (d.get("attributes") or {}).get("profile", {}).get("string") == profile
            and not d.get("consumesCounters")
        )

    one_g = _pending_after_greedy(
        [w for w in workloads if profile_is("1g.10gb") in _selectors(w)], static_slices("1g.10gb")
    )
    three_g_used = sum(_count(w) for w in workloads if profile_is("3g.40gb") in _selectors(w))
    broken = [w for w in workloads if w.kind in BROKEN_CATEGORY]
    groups = [("capacity", len(big)), ("fragmentation", len(one_g))]
    groups += [(BROKEN_CATEGORY[w.kind], 1) for w in broken]
    namespaces: dict[str, int] = {}
    for w in [*big, *one_g, *broken]:
        namespaces[w.namespace] = namespaces.get(w.namespace, 0) + 1
    return Expected(
        groups=groups,
        big_pending=len(big),
        big_devices=big_devices,
        one_g_pending=len(one_g),
        idle_three_g=static_slices("3g.40gb") - three_g_used,
        namespaces=namespaces,
    )


BIG_WANT = plain_selector(BIG)  # how the group summary says it: "memory >= 150Gi"
