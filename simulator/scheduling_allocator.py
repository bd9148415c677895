"""The simulator's scheduler: the allocator replay behind the simulator's ``Schedule`` contract.

The simulator lives in ``fleet`` and cannot import ``claims``; whoever runs it (the demo, tests,
benchmarks) passes :func:`allocator_schedule` in, so simulated pods are placed by the same rules the
diagnosis uses.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import chain
from typing import Any

from claims.allocator import FILTER_ERROR, FleetSnapshot, schedule_pod
from claims.cel import CelRuntimeError, DeviceView, device_view
from simulator.scheduling import ClusterState, Decision, Obj

_MAX_VIEWS = 500_000
_MAX_RESULTS = 200_000
# The simulator never mutates an object it handed out (a change replaces it), so a device dict's identity
# stands for its content. Entries keep the dict alive, so an id cannot be reused while it is cached.
_views: OrderedDict[int, tuple[Obj, DeviceView]] = OrderedDict()
# Selector results depend only on (expression, projection of the attributes it reads): safe to share.
_results: dict[tuple[str, Any], bool | CelRuntimeError] = {}


class _SharedCacheSnapshot(FleetSnapshot):
    """A snapshot that reuses device views and selector results across scheduling attempts."""

    def view(self, driver: str, pool: str, device: Obj) -> DeviceView:
        entry = _views.get(id(device))
        if entry is not None and entry[0] is device:
            return entry[1]
        view = device_view(driver, device)
        _views[id(device)] = (device, view)
        if len(_views) > _MAX_VIEWS:
            _views.popitem(last=False)
        return view


def allocator_schedule(pod: Obj, claims: list[Obj], state: ClusterState) -> Decision:
    """Place ``pod`` with the structured-allocator replay; claims already allocated are kept as they are."""
    if len(_results) > _MAX_RESULTS:
        _results.clear()
    snapshot = _SharedCacheSnapshot.from_objects(
        chain(
            state.objects("ResourceSlice"),
            state.objects("DeviceClass"),
            state.objects("ResourceClaim"),
            state.objects("Node"),
        )
    )
    snapshot._results = _results
    unallocated = [c for c in claims if not (c.get("status") or {}).get("allocation")]
    result = schedule_pod(pod, unallocated, snapshot)
    if result.node is None:
        reason = "SchedulerError" if result.message.startswith(FILTER_ERROR) else "Unschedulable"
        return Decision.failure(result.message, reason)
    return Decision.success(
        result.node,
        {
            key: list((alloc.get("devices") or {}).get("results") or [])
            for key, alloc in result.allocations.items()
        },
    )
