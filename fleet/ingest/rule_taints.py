"""The taints DeviceTaintRules put on devices: the writer of the rules' part of ``Device.taints``.

A device row is written with its published taints (the slice's); the rules' are brought in line under the
read-model lock, in the same transaction, by :func:`retaint`: after a slice batch for the pools it touched
(:func:`fleet.ingest.gpu_state.refresh` calls it), after a rule batch for the whole cluster
(:func:`rules_changed`). Both take the read-model lock before reading, so a rule and a slice written at
the same time never miss each other (the second waits for the first's commit, then reads it).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from fleet import counts
from fleet.ingest import locks
from fleet.ingest.sql import IN_CHUNK, chunks
from fleet.models import Cluster, Device, DeviceTaintRule, ResourceSlice
from fleet.taint_rules import TaintRule, device_taints, own_taints

PoolPair = tuple[str, str]


def rules(cluster_id: int) -> list[TaintRule]:
    """The cluster's stored rules, by name."""
    rows = DeviceTaintRule.objects.filter(cluster_id=cluster_id).order_by("name")
    return [TaintRule(n, s, t) for n, s, t in rows.values_list("name", "selector", "taint")]


def _selected(rule: TaintRule) -> Q | None:
    """The device rows a rule selects; None: none; an empty Q: all."""
    if rule.selector is None:
        return None
    fields = {"driver": "driver", "pool": "pool", "device": "name"}
    return Q(**{col: rule.selector[f] for f, col in fields.items() if rule.selector.get(f) is not None})


def retaint(cluster_id: int, pools: Collection[str] | None) -> set[PoolPair]:
    """Make the taints of the devices of ``pools`` (pool names; None: every pool) their own plus those of
    the rules selecting them; returns the (driver, pool) of the devices changed. Reads only devices that
    carry a taint or that a rule selects. Precondition: inside the ingest transaction, read-model lock held.

    With no rule and ``pools`` given it reads nothing more: the rows a slice batch wrote carry only their
    own taints, and a rule's removal cleared its taints from the whole cluster in its own batch."""
    current = rules(cluster_id)
    if not current and pools is not None:
        return set()
    devices = Device.objects.filter(cluster_id=cluster_id)
    if pools is not None:
        devices = devices.filter(pool__in=sorted(set(pools)))
    wanted: Q | None = ~Q(taints=[])
    for rule in current:
        q = _selected(rule)
        if q is None:
            continue
        if not q:  # an empty selector: every device
            wanted = None
            break
        wanted = wanted | q if wanted is not None else q
    if wanted is not None:
        devices = devices.filter(wanted)
    changed: list[Device] = []
    touched: set[PoolPair] = set()
    for pk, driver, pool, name, taints in devices.values_list("pk", "driver", "pool", "name", "taints"):
        taints = taints or []
        new = device_taints(own_taints(taints), current, driver, pool, name)
        if new != taints:
            changed.append(Device(pk=pk, taints=new, tainted=counts.is_tainted(new)))
            touched.add((driver, pool))
    Device.objects.bulk_update(changed, ["taints", "tainted"], batch_size=500)
    return touched


def rules_changed(cluster: Cluster, *_: Any) -> None:
    """The rule kind's write and delete hook (:class:`~fleet.ingest.specs.TableSpec`): re-taint the
    cluster's devices, then recompute the read model of the pools whose taints moved and stamp their
    slices (the heatmap feed re-reads a pool when its slices' write time moves)."""
    from fleet.ingest import gpu_state  # gpu_state calls retaint: imported here, not at module level

    locks.read_model_lock(cluster.pk)
    touched = retaint(cluster.pk, None)
    if not touched:
        return
    names = sorted({pool for _, pool in touched})
    stamp(cluster.pk, names, timezone.now())
    gpu_state.refresh(cluster.pk, names)


def stamp(cluster_id: int, pools: list[str], at: datetime) -> None:
    for chunk in chunks(pools, IN_CHUNK):
        ResourceSlice.objects.filter(cluster_id=cluster_id, pool__in=list(chunk)).update(synced_at=at)
