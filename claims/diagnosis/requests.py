"""The requests of a claim as the diagnosis reads them (``exactly``/``firstAvailable``, v1 shapes), the
selectors of a request, its device class, and which device taints its tolerations leave.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from claims.cel import CompiledSelector, compile_selector
from claims.diagnosis.result import Obj
from fleet.quantity import parse_quantity


@dataclass
class Req:
    name: str  # "req" or "req/sub"
    parent: str
    spec: Obj
    class_name: str
    count: int
    all_mode: bool
    selectors: list[CompiledSelector]
    class_selectors: list[CompiledSelector]
    tolerations: list[Obj]
    capacity: dict[str, Fraction]
    admin: bool = False  # adminAccess: existing allocations do not count (taints and counters do)


def requests_of(claim: Obj) -> list[list[Obj]]:
    """Per spec request, [(name, spec)] alternatives: one for ``exactly``, several for ``firstAvailable``."""
    out: list[list[Obj]] = []
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        name = request.get("name", "")
        if request.get("firstAvailable"):
            out.append(
                [
                    {"name": f"{name}/{s.get('name', '')}", "parent": name, "spec": s}
                    for s in request["firstAvailable"]
                ]
            )
        else:
            out.append([{"name": name, "parent": name, "spec": request.get("exactly") or {}}])
    return out


def selector_texts(spec: Obj) -> list[str]:
    return [((s or {}).get("cel") or {}).get("expression", "") for s in spec.get("selectors") or []]


def claim_from(obj: Obj) -> Obj:
    if obj.get("kind") == "ResourceClaimTemplate":
        meta = obj.get("metadata") or {}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": meta.get("namespace", "default"), "name": meta.get("name", "template")},
            "spec": copy.deepcopy((obj.get("spec") or {}).get("spec") or {}),
        }
    claim = copy.deepcopy(obj)
    claim.setdefault("metadata", {}).setdefault("name", "claim")
    claim["metadata"].setdefault("namespace", "default")
    return claim


def counter_value(raw: Any) -> Fraction | int:
    value = parse_quantity(str((raw or {}).get("value", "0"))).value
    return value.numerator if value.denominator == 1 else value


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key", "")
    if key and key != taint.get("key"):
        return False
    if (toleration.get("operator") or "Equal") == "Exists":
        return True
    return bool(key) and toleration.get("value", "") == taint.get("value", "")


def untolerated_taints(device: Obj, tolerations: list[Obj]) -> list[Obj]:
    return [
        t
        for t in device.get("taints") or []
        if t.get("effect") in ("NoSchedule", "NoExecute") and not any(_tolerates(x, t) for x in tolerations)
    ]


def make_req(item: Obj, classes: dict[str, Obj]) -> Req:
    spec = item["spec"]
    class_obj = classes.get(spec.get("deviceClassName", "")) or {}
    mode = spec.get("allocationMode") or "ExactCount"
    return Req(
        name=item["name"],
        parent=item["parent"],
        spec=spec,
        class_name=spec.get("deviceClassName", ""),
        count=int(spec.get("count", 1)) if mode == "ExactCount" else 0,
        all_mode=mode == "All",
        selectors=[compile_selector(e) for e in selector_texts(spec)],
        class_selectors=[compile_selector(e) for e in selector_texts(class_obj.get("spec") or {})],
        tolerations=list(spec.get("tolerations") or []),
        capacity={
            k: parse_quantity(str(v)).value
            for k, v in ((spec.get("capacity") or {}).get("requests") or {}).items()
        },
        admin=bool(spec.get("adminAccess")),
    )
