"""The heatmap matrix: one cell per physical GPU, one row per node; pure functions over selector data.

A row is keyed ``"<cluster>/<node>"`` and holds ``[cluster, node, model, pool, cells]``; a cell is
``[gpu index, allocated compute slices (0..7), flags, MIG layout, claims holding it]``. The value drawn is
``slices / 7`` (a full-GPU allocation is 7/7; static MIG: the N of allocated "Ng" devices; dynamic MIG: the
N of allocated partitions), the rule of :func:`fleet.selectors.summarize`. Rows are the unit of change: a
delta replaces whole rows and removes rows, so applying it is a dictionary update on either side.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from fleet.filters import FleetFilter
from fleet.normalize import FULL_GPU_SLICES
from fleet.selectors import CounterSets, DeviceKey, GpuStateRow, Holder, unavailable_devices

TAINTED = 1  # the GPU or one of its MIG devices carries a NoSchedule/NoExecute taint
UNAVAILABLE = 2  # some unallocated device is blocked by counters its allocated siblings use (dynamic MIG)
RESERVED = 4  # some holding claim is reserved for a consumer
UNRESERVED = 8  # some holding claim is allocated with no consumer (a suspected leak when it lasts)

Cell = list[Any]  # [index, slices, flags, layout, claims]
Row = list[Any]  # [cluster, node, model, pool, [cells]]
Rows = dict[str, Row]


class Gpu(NamedTuple):
    """One physical GPU of the heatmap: where it sits and its cell's values."""

    cluster_id: int
    driver: str
    pool: str
    uuid: str
    node: str  # the node name, or the pool for devices without one
    model: str
    minor: int | None  # the GPU index; None when no device published it
    used: int  # allocated compute slices, not yet capped at 7
    flags: int
    layout: str
    claims: int  # distinct claims holding one of its devices


# A GPU while it is built from device dicts: [cluster id, driver, pool, node, model, index, slices used,
# flags, dynamic, MIG profiles [(slices, profile, allocated)], claims {(namespace, name)}].
_CID, _DRIVER, _POOL, _NODE, _MODEL, _INDEX, _USED, _FLAGS, _DYNAMIC, _PROFILES, _CLAIMS = range(11)


def device_key(d: Mapping[str, Any]) -> DeviceKey:
    return (d["cluster_id"], d["driver"], d["pool"], d["name"])


def row_key(cluster: str, node: str) -> str:
    return f"{cluster}/{node}"


def blocked_devices(
    devices: Sequence[Mapping[str, Any]], allocated: set[DeviceKey], counter_sets: CounterSets
) -> set[DeviceKey]:
    """:func:`fleet.selectors.unavailable_devices`, evaluated only where it can find something: devices
    sharing a counter set with an allocated device. (A device that would not fit its counter set even with
    nothing allocated, i.e. a malformed slice, is therefore not flagged here.)"""
    candidates = _sharing_with_allocated(devices, allocated)
    if not candidates:
        return set()
    return unavailable_devices(candidates, allocated, counter_sets)  # type: ignore[arg-type]


def shown_blocked(
    devices: Sequence[Mapping[str, Any]], allocated: set[DeviceKey], blocked: set[DeviceKey]
) -> set[DeviceKey]:
    """:func:`blocked_devices` from the whole rule's result ``blocked`` (``unavailable_devices`` of the
    same devices): its devices that share a counter set with an allocated device (the allocated devices'
    use of a set is the same whether the others are judged or not)."""
    if not blocked:
        return set()
    return blocked & {device_key(d) for d in _sharing_with_allocated(devices, allocated)}


def _sharing_with_allocated(
    devices: Sequence[Mapping[str, Any]], allocated: set[DeviceKey]
) -> list[Mapping[str, Any]]:
    touched: set[tuple[int, str, str, str]] = set()
    for d in devices:
        if d["counters_consumed"] and (d["cluster_id"], d["driver"], d["pool"], d["name"]) in allocated:
            for c in d["counters_consumed"]:
                touched.add((d["cluster_id"], d["driver"], d["pool"], str(c.get("counterSet"))))
    if not touched:
        return []
    return [
        d
        for d in devices
        if d["counters_consumed"]
        and any(
            (d["cluster_id"], d["driver"], d["pool"], str(c.get("counterSet"))) in touched
            for c in d["counters_consumed"]
        )
    ]


def layout(profiles: Iterable[tuple[int, str, bool]], dynamic: bool) -> str:
    """A GPU's MIG layout from its MIG devices' (compute slices, profile, allocated): "" for a whole GPU;
    the static MIG profiles, largest first; "dynamic" and its allocated partitions."""
    ordered = sorted(profiles, key=lambda p: (-p[0], p[1]))
    if dynamic:
        return "dynamic" + "".join(f" {p[1]}" for p in ordered if p[2])
    return " ".join(p[1] for p in ordered)


def gpu_records(
    devices: Iterable[Mapping[str, Any]],
    allocated: set[DeviceKey],
    counter_sets: CounterSets,
    holders: Mapping[DeviceKey, list[Holder]],
) -> list[Gpu]:
    """The physical GPUs of GPU/MIG device dicts (the fields of ``selectors.HEATMAP_FIELDS``).

    Precondition: ``devices`` are current (highest pool generation). The reference of the read model's
    records (:func:`gpus_of_states`), tested equal.
    """
    devices = list(devices)
    blocked = blocked_devices(devices, allocated, counter_sets)
    gpus: dict[tuple[int, str], list[Any]] = {}
    for d in devices:
        gpu_uuid = d["gpu_uuid"]
        if not gpu_uuid:
            continue
        cid = d["cluster_id"]
        gpu = gpus.get((cid, gpu_uuid))
        if gpu is None:
            node = d["node_name"] or d["pool"]
            gpu = [cid, d["driver"], d["pool"], node, d["model"], None, 0, 0, False, [], set()]
            gpus[(cid, gpu_uuid)] = gpu
        kind = d["kind"]
        if d["gpu_minor"] is not None and (kind == "gpu" or gpu[_INDEX] is None):
            gpu[_INDEX] = d["gpu_minor"]
        key = (cid, d["driver"], d["pool"], d["name"])
        is_allocated = key in allocated
        if d["tainted"]:
            gpu[_FLAGS] |= TAINTED
        if blocked and key in blocked:
            gpu[_FLAGS] |= UNAVAILABLE
        if is_allocated:
            gpu[_USED] += d["compute_slices"]
            for h in holders.get(key, ()):
                gpu[_CLAIMS].add((h.namespace, h.name))
                gpu[_FLAGS] |= RESERVED if h.state == "reserved" else UNRESERVED
        if kind == "mig":
            # has_counters: the devices were read without their counters (selectors.heatmap_devices)
            if d["counters_consumed"] or d.get("has_counters"):
                gpu[_DYNAMIC] = True
            gpu[_PROFILES].append((d["compute_slices"], d["mig_profile"], is_allocated))
    return [
        Gpu(
            g[_CID],
            g[_DRIVER],
            g[_POOL],
            uuid,
            g[_NODE],
            g[_MODEL],
            g[_INDEX],
            g[_USED],
            g[_FLAGS],
            layout(g[_PROFILES], g[_DYNAMIC]) if g[_PROFILES] else "",
            len(g[_CLAIMS]),
        )
        for (_, uuid), g in gpus.items()
    ]


def gpus_of_states(rows: Iterable[GpuStateRow]) -> list[Gpu]:
    """GPU records from the per-GPU read model's rows (:func:`fleet.selectors.gpu_states`), which ingest
    computed by :func:`blocked_devices` and :func:`layout`."""
    out = []
    for (
        cid,
        driver,
        pool,
        uuid,
        node,
        model,
        index,
        used,
        tainted,
        reserved,
        unreserved,
        blocked,
        mig,
        claims,
    ) in rows:
        flags = (
            (TAINTED if tainted else 0)
            | (RESERVED if reserved else 0)
            | (UNRESERVED if unreserved else 0)
            | (UNAVAILABLE if blocked else 0)
        )
        out.append(Gpu(cid, driver, pool, uuid, node or pool, model, index, used, flags, mig, claims))
    return out


def rows_of(
    gpus: Iterable[Gpu],
    cluster_names: Mapping[int, str],
    labels: Mapping[tuple[int, str], Mapping[str, str]],
    filters: FleetFilter,
) -> Rows:
    """Heatmap rows of GPU records narrowed by ``filters`` (GPUs of clusters missing from
    ``cluster_names`` are left out). A row's model and pool are those of its lowest-indexed GPU."""
    by_row: dict[tuple[int, str], list[Gpu]] = {}
    state = filters.state
    for gpu in gpus:
        if gpu.cluster_id not in cluster_names:
            continue
        if (filters.model and gpu.model != filters.model) or (filters.pool and gpu.pool != filters.pool):
            continue
        if filters.label and not filters.matches_labels(labels.get((gpu.cluster_id, gpu.node), {})):
            continue
        if state and not cell_in_state(min(gpu.used, FULL_GPU_SLICES), gpu.flags, state):
            continue
        members = by_row.get((gpu.cluster_id, gpu.node))
        if members is None:
            by_row[(gpu.cluster_id, gpu.node)] = [gpu]
        else:
            members.append(gpu)
    rows: Rows = {}
    for (cid, node), members in by_row.items():
        cluster = cluster_names[cid]
        if len(members) > 1:
            members.sort(key=lambda g: (g.minor is None, g.minor or 0, g.uuid))
        first = members[0]
        cells = [[g.minor, min(g.used, FULL_GPU_SLICES), g.flags, g.layout, g.claims] for g in members]
        _number_cells(cells)
        rows[row_key(cluster, node)] = [cluster, node, first.model, first.pool, cells]
    return rows


def build_rows(
    devices: Iterable[Mapping[str, Any]],
    allocated: set[DeviceKey],
    counter_sets: CounterSets,
    holders: Mapping[DeviceKey, list[Holder]],
    cluster_names: Mapping[int, str],
    labels: Mapping[tuple[int, str], Mapping[str, str]],
    filters: FleetFilter,
) -> Rows:
    """Rows of the heatmap for GPU/MIG device dicts (the fields of ``selectors.HEATMAP_FIELDS``).

    Precondition: ``devices`` are current (highest pool generation).
    """
    return rows_of(gpu_records(devices, allocated, counter_sets, holders), cluster_names, labels, filters)


def cell_in_state(used: int, flags: int, state: str) -> bool:
    """Whether a GPU cell shows the device state the ``state`` filter asks for."""
    if state == "free":
        return used < FULL_GPU_SLICES and not flags & TAINTED
    if state == "allocated":
        return used > 0
    if state == "reserved":
        return bool(flags & RESERVED)
    if state == "tainted":
        return bool(flags & TAINTED)
    # fleet.counts' unavailable: idle and not allocatable, by a taint or by counters its partitions use.
    return bool(flags & UNAVAILABLE) or (bool(flags & TAINTED) and used < FULL_GPU_SLICES)


def _number_cells(cells: list[Cell]) -> None:
    """Cells in GPU-index order; a GPU without a published index takes the next free column."""
    taken = {c[0] for c in cells if c[0] is not None}
    nxt = 0
    for c in cells:
        if c[0] is None:
            while nxt in taken:
                nxt += 1
            c[0] = nxt
            taken.add(nxt)
    cells.sort(key=lambda c: c[0])


def row_order(rows: Rows) -> list[str]:
    """Row keys grouped by cluster, model and pool, then by node name."""
    return sorted(rows, key=lambda k: (rows[k][0], rows[k][2], rows[k][3], rows[k][1]))


@dataclass(frozen=True)
class Delta:
    """Rows to replace (or add) and row keys to remove."""

    rows: Rows
    removed: list[str]

    def __bool__(self) -> bool:
        return bool(self.rows or self.removed)


def diff(old: Rows, new: Rows, scope: Iterable[str] | None = None) -> Delta:
    """What turns ``old`` into ``new``. With ``scope`` (cluster names), rows of other clusters are
    left alone: ``new`` was rebuilt for those clusters only."""
    clusters = set(scope) if scope is not None else None
    changed = {k: r for k, r in new.items() if old.get(k) != r}
    removed = [k for k, r in old.items() if k not in new and (clusters is None or r[0] in clusters)]
    return Delta(changed, sorted(removed))


def apply(rows: Rows, delta: Delta) -> Rows:
    """The rows after a delta (a new dict; the input is unchanged)."""
    out = {k: r for k, r in rows.items() if k not in set(delta.removed)}
    out.update(delta.rows)
    return out


def summary(rows: Rows) -> dict[str, int]:
    """GPU, compute-slice and flag counts over the rows (the page header and the bench)."""
    gpus = slices = tainted = 0
    for row in rows.values():
        for cell in row[4]:
            gpus += 1
            slices += cell[1]
            tainted += bool(cell[2] & TAINTED)
    return {
        "gpus": gpus,
        "compute_slices": gpus * FULL_GPU_SLICES,
        "compute_slices_allocated": slices,
        "tainted": tainted,
    }


def group_by_cluster(devices: Iterable[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    out: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
    for d in devices:
        out[d["cluster_id"]].append(d)
    return out
