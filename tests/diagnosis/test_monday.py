"""The monday scenario, placed by the allocator replay: every pending pod lands in the expected group."""

from __future__ import annotations

from collections import Counter

from claims.diagnosis import diagnose
from claims.fleetstate import FleetState
from simulator import scenarios
from simulator.scheduling_allocator import allocator_schedule

KINDS = ("ResourceSlice", "DeviceClass", "ResourceClaim", "ResourceClaimTemplate", "Pod", "Node", "Event")


def test_monday_pending_pods_fall_into_the_weekend_groups() -> None:
    scenario = scenarios.monday(schedule=allocator_schedule)
    state = FleetState.from_objects(o for kind in KINDS for o in scenario.cluster.objects(kind))
    results = [diagnose(state, pod) for pod in state.objects["Pod"] if not pod["spec"].get("nodeName")]
    assert Counter(r.category for r in results) == {
        "capacity": 9,
        "fragmentation": 5,
        "cel-error": 2,
        "no-match": 1,
    }
    finetune = next(r for r in results if r.category == "capacity")
    assert "(16 B200, 8 B300), 0 free" in finetune.summary
    chat = next(r for r in results if r.category == "fragmentation")
    assert "1g.10gb: none free" in chat.summary and "12 x 3g.40gb" in chat.summary
    assert {r.requests[0]["attribute"] for r in results if r.category == "cel-error"} == {
        "gpuMemoryGiB",
        "nvlinkDomain",
    }
    # identical devices share selector evaluations
    assert state.saved > 10 * state.evaluations
