"""DeviceTaintRules (``resource.k8s.io/v1``, KEP-5055): which devices a rule taints, and the taints a device
ends up with. Pure functions, shared by ingest (``Device.taints``) and the diagnosis (its patched slices).

Upstream (``k8s.io/dynamic-resource-allocation/resourceslice/tracker``, v0.37.2, ``applyPatches``) appends
a rule's taint to every device its ``spec.deviceSelector`` selects, as if the driver had published it; the
scheduler, the eviction controller and the pool-status controller all read those patched slices. A rule
without a selector selects nothing; an empty selector selects every device; ``driver``, ``pool`` and
``device`` (each optional) must all equal the device's. (``deviceClassName`` and CEL ``selectors`` were
tombstoned in 1.35 and are not part of the API any more.)

A taint a rule applied carries the rule's name under :data:`RULE_KEY`, a key no published DeviceTaint has
(normalize keeps only the API's fields of published taints), so pages and the diagnosis can say where it
comes from and ingest can tell it from the device's own taints.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RULE_KEY = "deviceTaintRule"
TAINT_FIELDS = ("key", "value", "effect", "timeAdded")  # a DeviceTaint's fields in resource.k8s.io/v1
_SELECTOR_FIELDS = ("driver", "pool", "device")


@dataclass(frozen=True, slots=True)
class TaintRule:
    """A rule as the matching needs it: ``selector`` None selects nothing; in it, None means any."""

    name: str
    selector: Mapping[str, str | None] | None
    taint: Mapping[str, Any]

    def selects(self, driver: str, pool: str, device: str) -> bool:
        s = self.selector
        if s is None:
            return False
        return all(s.get(f) in (None, v) for f, v in (("driver", driver), ("pool", pool), ("device", device)))

    def applied_taint(self) -> dict[str, Any]:
        """The taint as a device carries it: the rule's, plus the rule's name."""
        return {**self.taint, RULE_KEY: self.name}


def own_taints(taints: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The taints the device's driver published (those no rule applied)."""
    return [dict(t) for t in taints if RULE_KEY not in t]


def device_taints(
    own: Sequence[Mapping[str, Any]], rules: Iterable[TaintRule], driver: str, pool: str, device: str
) -> list[dict[str, Any]]:
    """A device's taints: its own, then those of the rules selecting it, in rule order (as upstream)."""
    return [dict(t) for t in own] + [r.applied_taint() for r in rules if r.selects(driver, pool, device)]


def rules_of(objects: Iterable[Mapping[str, Any]]) -> list[TaintRule]:
    """DeviceTaintRule objects (API shape, any served version: the fields are the same) as rules, by name.
    Malformed parts count as absent: the API server validated what it stored."""
    out = []
    for obj in objects:
        meta, spec = _dict(obj.get("metadata")), _dict(obj.get("spec"))
        raw = spec.get("deviceSelector")
        selector = None
        if isinstance(raw, dict):
            selector = {f: raw.get(f) if isinstance(raw.get(f), str) else None for f in _SELECTOR_FIELDS}
        taint = _dict(spec.get("taint"))
        kept = {f: taint[f] for f in TAINT_FIELDS if f in taint}
        out.append(TaintRule(str(meta.get("name", "")), selector, kept))
    return sorted(out, key=lambda r: r.name)


def patch_slices(slices: list[dict[str, Any]], rules: Sequence[TaintRule]) -> list[dict[str, Any]]:
    """``slices`` (API objects) with the rules' taints appended to the devices they select, as the
    scheduler sees them. Slices no rule touches are returned as they are; the others are copied (never
    changed in place: callers may share them)."""
    if not rules:
        return slices
    out = []
    for s in slices:
        spec = _dict(s.get("spec"))
        driver, pool_name = str(spec.get("driver", "")), str(_dict(spec.get("pool")).get("name", ""))
        devices = spec.get("devices")
        if not isinstance(devices, list):
            out.append(s)
            continue
        patched = None
        for i, device in enumerate(devices):
            if not isinstance(device, dict):
                continue
            name = str(device.get("name", ""))
            added = [r.applied_taint() for r in rules if r.selects(driver, pool_name, name)]
            if not added:
                continue
            if patched is None:
                patched = list(devices)
            patched[i] = {**device, "taints": [*(device.get("taints") or []), *added]}
        out.append(s if patched is None else {**s, "spec": {**spec, "devices": patched}})
    return out


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


RULE_SUFFIX = " by DeviceTaintRule "


def rule_text(taint: Mapping[str, Any]) -> str:
    """`` by DeviceTaintRule NAME`` for a taint a rule applied, else empty (suffix of a taint's text)."""
    name = taint.get(RULE_KEY)
    return f"{RULE_SUFFIX}{name}" if name else ""


def rules_named(texts: Iterable[str]) -> list[str]:
    """The rules named by taint texts ending in :func:`rule_text`."""
    return sorted({t.rsplit(RULE_SUFFIX, 1)[1] for t in texts if RULE_SUFFIX in t})
