"""Object dicts exactly as the NVIDIA GPU DRA driver and Kubernetes publish them (resource.k8s.io/v1).

This package is the single place that knows how `kubernetes-sigs/dra-driver-nvidia-gpu` shapes its
ResourceSlices (its `cmd/gpu-kubelet-plugin/deviceinfo.go`, `mig.go` and `driver.go`), which GPU models
exist and what their MIG catalogs look like (`NVIDIA/mig-parted`
`deployments/systemd/config-default.yaml`; real A100-40GB values in KEP-4815). Fixtures, the fleet
simulator and tests build their objects here so that every consumer (normalize, diagnosis, allocator
replay) is exercised against the same shapes a real 1.36/1.37 cluster serves.

Pure Python, no Django, no randomness: every uid, UUID and generated name is derived from the inputs
(uuid5 / sha256), so two runs with the same arguments produce byte-identical objects.

Facts copied from the driver source (main, 2026):
- full GPU device name `gpu-<minor>`; MIG name `gpu-<minor>-mig-<profile w/o dots, RFC1123>-<GI id>-<start>`
  (`mig.go` `ToCanonicalName`; `+` becomes `-`, so `1g.10gb+me` -> `1g10gb-me`);
- static MIG devices carry `uuid` lower-cased (`strings.ToLower(d.UUID)` in `deviceinfo.go`), so the
  attribute reads `mig-…`, while full GPUs keep NVML's `GPU-…`;
- static MIG capacities: multiprocessors, copyEngines, decoders, encoders, jpegEngines, ofaEngines, memory
  plus `memorySlice<i>` = 1 per occupied memory slice; dynamic MIG devices have the same capacities
  without the memory slices and express placement through `consumesCounters` (`partitions.go`);
- counter names are the capacity names in DNS form (`copy-engines`, …) plus `memory-slice-<i>`;
- the full GPU in DynamicMIG mode advertises the per-dimension maximum over all profiles and consumes every
  counter of its set;
- dynamic MIG skips no GI profile that has C == G (the `+me` GI profile is included: the skipped CI profile
  `1_SLICE_REV1` is a compute-instance variant, not the `+me` GPU-instance profile).

Modules: ``constants`` (driver names, API limits, deterministic ids, quantities), ``models`` (GPU models,
MIG profiles and placements, layouts), ``devices`` (device names, attributes, full-GPU and MIG devices,
counter sets), ``objects`` (ResourceSlices per node and MIG mode, DeviceClasses, Nodes), ``claims``
(requests, claims, templates, pods, allocation status), ``events`` (events and scheduler messages).
"""

from simulator.nvidia.claims import (
    allocation_status,
    claim_object,
    claim_template,
    consumer_ref,
    exactly_request,
    first_available_request,
    from_claim,
    from_template,
    generated_claim_name,
    generated_claim_prefix,
    node_selector_for,
    pod_object,
    scheduled_condition,
    subrequest,
    unschedulable_condition,
)
from simulator.nvidia.constants import (
    CD_DRIVER,
    CUDA_DRIVER_VERSION,
    DEFAULT_CREATED,
    DRIVER_VERSION,
    GPU_DRIVER,
    KUBELET_VERSION,
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_COUNTER_SETS_PER_SLICE,
    MAX_COUNTERS_PER_SET,
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_ADVANCED,
    MAX_RESULTS_PER_CLAIM,
    RESOURCE_API,
    Obj,
    binary_quantity,
    gpu_uuid,
    mig_uuid,
    name_suffix,
    node_uid,
    parse_quantity,
    stable_uid,
)
from simulator.nvidia.devices import (
    camel_to_dns,
    counter_set,
    counter_set_name,
    gpu_device,
    mig_device,
    mig_device_name,
    pci_bus_id,
    pcie_root,
)
from simulator.nvidia.events import (
    CANNOT_ALLOCATE,
    cel_runtime_error_message,
    failed_claim_creation_event,
    failed_scheduling_event,
    fit_error_message,
)
from simulator.nvidia.models import (
    LAYOUTS,
    MIXED_CYCLE,
    MODELS,
    PROFILE_KINDS,
    GpuModel,
    MigProfile,
    layout_for_gpu,
    model_family,
)
from simulator.nvidia.objects import (
    compute_domain_slice,
    device_classes,
    device_taint_rule,
    node_object,
    node_slices,
    slice_name,
)

__all__ = [
    "CANNOT_ALLOCATE",
    "CD_DRIVER",
    "CUDA_DRIVER_VERSION",
    "DEFAULT_CREATED",
    "DRIVER_VERSION",
    "GPU_DRIVER",
    "KUBELET_VERSION",
    "LAYOUTS",
    "MAX_ATTRIBUTES_AND_CAPACITIES",
    "MAX_COUNTERS_PER_SET",
    "MAX_COUNTER_SETS_PER_SLICE",
    "MAX_DEVICES_PER_SLICE",
    "MAX_DEVICES_PER_SLICE_ADVANCED",
    "MAX_RESULTS_PER_CLAIM",
    "MIXED_CYCLE",
    "MODELS",
    "PROFILE_KINDS",
    "RESOURCE_API",
    "GpuModel",
    "MigProfile",
    "Obj",
    "allocation_status",
    "binary_quantity",
    "camel_to_dns",
    "cel_runtime_error_message",
    "claim_object",
    "claim_template",
    "compute_domain_slice",
    "consumer_ref",
    "counter_set",
    "counter_set_name",
    "device_classes",
    "device_taint_rule",
    "exactly_request",
    "failed_claim_creation_event",
    "failed_scheduling_event",
    "first_available_request",
    "fit_error_message",
    "from_claim",
    "from_template",
    "generated_claim_name",
    "generated_claim_prefix",
    "gpu_device",
    "gpu_uuid",
    "layout_for_gpu",
    "mig_device",
    "mig_device_name",
    "mig_uuid",
    "model_family",
    "name_suffix",
    "node_object",
    "node_selector_for",
    "node_slices",
    "node_uid",
    "parse_quantity",
    "pci_bus_id",
    "pcie_root",
    "pod_object",
    "scheduled_condition",
    "slice_name",
    "stable_uid",
    "subrequest",
    "unschedulable_condition",
]
