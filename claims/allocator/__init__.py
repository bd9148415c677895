"""A replay of the structured allocator (incubating, dynamic-resource-allocation v0.37.2) over raw dicts.

It answers "could these claims be allocated on this node, and with which devices?" with the same first-fit,
depth-first search and the same messages as the kube-scheduler DynamicResources plugin
(k8s.io/dynamic-resource-allocation/structured, pkg/scheduler/framework/plugins/dynamicresources).

DeviceTaintRules are applied by the caller (``claims.fleetstate`` patches the slices, as the scheduler's
tracker does). Binding conditions: pools with them are tried last and results carry them; the wait for them
(the scheduler's PreBind) is not modelled. Not implemented: ListTypeAttributes, compatibility
groups, derived attributes, the Filter timeout, scoring of firstAvailable, allocated-claim nodeSelector
checks (pass only unallocated claims) and the per-node counter/capacity validation details of ``buildPool``
beyond duplicate device names and unknown counter references.

Layout: ``snapshot`` (inputs, results) → ``nodes``, ``pools``, ``requests`` (what a node offers and a claim
asks) → ``devices`` (what is in use, per-device checks) → ``search`` (the search and its entry points).
"""

from __future__ import annotations

from claims.allocator.nodes import node_matches
from claims.allocator.requests import policy_amount
from claims.allocator.search import allocate, schedule_pod
from claims.allocator.snapshot import (
    CEL_RUNTIME,
    CLAIM_LIMIT,
    CLASS_MISSING,
    CONSTRAINT,
    DEFAULT_FEATURES,
    FILTER_ERROR,
    MAX_RESULTS,
    POOL_UNUSABLE,
    PREFILTER_ERROR,
    UNSUPPORTED,
    AllocationResult,
    Features,
    FleetSnapshot,
    ScheduleResult,
    SelectorStats,
)

__all__ = [
    "CEL_RUNTIME",
    "CLAIM_LIMIT",
    "CLASS_MISSING",
    "CONSTRAINT",
    "DEFAULT_FEATURES",
    "FILTER_ERROR",
    "MAX_RESULTS",
    "POOL_UNUSABLE",
    "PREFILTER_ERROR",
    "UNSUPPORTED",
    "AllocationResult",
    "Features",
    "FleetSnapshot",
    "ScheduleResult",
    "SelectorStats",
    "allocate",
    "node_matches",
    "policy_amount",
    "schedule_pod",
]
