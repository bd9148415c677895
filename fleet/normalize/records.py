"""The typed records normalize returns, one per kind we watch, and the rule that names a pod's claims.

Frozen dataclasses: the normalize functions build them, the ingest stores them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Meta:
    """What every stored Kubernetes object has."""

    kind: str
    uid: str
    namespace: str
    name: str
    resource_version: int
    created_at: datetime | None
    deleted_at: datetime | None
    labels: dict[str, str]
    raw: dict[str, Any]

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"


@dataclass(frozen=True, slots=True)
class DeviceClassRecord:
    meta: Meta
    selectors: list[str]
    extended_resource_name: str


@dataclass(frozen=True, slots=True)
class NodeRecord:
    meta: Meta
    ready: bool
    unschedulable: bool
    gpu_product: str
    clique: str


@dataclass(frozen=True, slots=True)
class DeviceRecord:
    """One device of a ResourceSlice, with the fields the dashboard groups and filters by."""

    name: str
    kind: str  # gpu / mig / vfio / channel / other
    model: str  # model family
    product_name: str
    uuid: str
    parent_uuid: str
    gpu_uuid: str  # the physical GPU: its own uuid, or the parent's for MIG
    gpu_minor: int | None
    mig_profile: str
    compute_slices: int  # N of a MIG "Ng" profile; 7 for a full GPU; 0 otherwise
    memory_bytes: int | None
    taints: list[dict[str, Any]]
    counters_consumed: list[dict[str, Any]]
    attributes: dict[str, Any]
    capacity: dict[str, Any]
    node_name: str  # the slice's node, or the device's own with perDeviceNodeSelection


@dataclass(frozen=True, slots=True)
class SliceRecord:
    meta: Meta
    driver: str
    pool: str
    pool_generation: int
    pool_slice_count: int
    node_name: str
    all_nodes: bool
    per_device_node_selection: bool
    shared_counters: list[dict[str, Any]]
    devices: list[DeviceRecord]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """A claim request in compact form; ``alternatives`` holds firstAvailable subrequests in order."""

    name: str
    device_class: str
    selectors: list[str]
    allocation_mode: str
    count: int
    admin_access: bool
    tolerations: list[dict[str, Any]]
    capacity: dict[str, str]
    alternatives: list[RequestRecord] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "deviceClassName": self.device_class,
            "selectors": self.selectors,
            "allocationMode": self.allocation_mode,
            "count": self.count,
        }
        if self.admin_access:
            data["adminAccess"] = True
        if self.tolerations:
            data["tolerations"] = self.tolerations
        if self.capacity:
            data["capacity"] = self.capacity
        if self.alternatives:
            data["firstAvailable"] = [alt.as_dict() for alt in self.alternatives]
        return data


@dataclass(frozen=True, slots=True)
class AllocationRecord:
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool
    share_id: str
    consumed_capacity: dict[str, str]


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    requests: list[RequestRecord]
    constraints: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    meta: Meta
    spec: ClaimSpec
    state: str  # pending / allocated / reserved / deallocating
    allocations: list[AllocationRecord]
    reserved_for: list[dict[str, str]]
    node_name: str
    owner_pod_uid: str
    owner_pod_name: str
    pod_claim_name: str
    allocated_at: datetime | None


@dataclass(frozen=True, slots=True)
class TemplateRecord:
    meta: Meta
    spec: ClaimSpec


def pod_claim_names(
    claim_refs: Sequence[Mapping[str, Any]], claim_statuses: Sequence[Mapping[str, Any]]
) -> tuple[set[str], bool]:
    """(names of the claims a pod uses, whether some reference has no claim yet).

    A reference names its claim directly (``resourceClaimName``) or through a template, whose generated
    claim's name the pod's ``status.resourceClaimStatuses`` gives once the claim controller made it.
    """
    statuses = {s.get("name"): s.get("resourceClaimName") for s in claim_statuses or []}
    names: set[str] = set()
    missing = False
    for ref in claim_refs or []:
        name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
        if name:
            names.add(str(name))
        else:
            missing = True
    return names, missing


@dataclass(frozen=True, slots=True)
class PodRecord:
    meta: Meta
    phase: str
    node_name: str
    scheduled_status: str
    scheduled_reason: str
    scheduled_message: str
    scheduled_at: datetime | None
    claim_refs: list[dict[str, str]]  # spec.resourceClaims
    claim_statuses: list[dict[str, str]]  # status.resourceClaimStatuses
    gpu_requests: int  # GPU extended resources asked for

    def claim_names(self) -> set[str]:
        """The names of the ResourceClaims this pod uses (see ``pod_claim_names``)."""
        return pod_claim_names(self.claim_refs, self.claim_statuses)[0]


@dataclass(frozen=True, slots=True)
class DeviceTaintRuleRecord:
    """A DeviceTaintRule: one taint for the devices its selector selects (:mod:`fleet.taint_rules`)."""

    meta: Meta
    selector: dict[str, str | None] | None  # driver / pool / device, None: any; no selector: no device
    taint: dict[str, Any]  # key, value, effect, timeAdded


@dataclass(frozen=True, slots=True)
class EventRecord:
    meta: Meta
    reason: str
    type: str
    message: str
    involved_kind: str
    involved_namespace: str
    involved_name: str
    involved_uid: str
    count: int
    first_at: datetime | None
    last_at: datetime | None


Record = (
    DeviceClassRecord
    | NodeRecord
    | SliceRecord
    | ClaimRecord
    | TemplateRecord
    | PodRecord
    | EventRecord
    | DeviceTaintRuleRecord
)
