"""Findings on a ResourceClaim, ResourceClaimTemplate or DeviceClass, without allocating anything.

Each rule comes from something that really bites (tests/controlplane/FINDINGS.md; upstream: the CEL
environment of ``staging/src/k8s.io/dynamic-resource-allocation/cel/compile.go``, the quantity library
``staging/src/k8s.io/apiserver/pkg/cel/library/quantity.go``, ``pkg/apis/resource/validation/validation.go``,
and ``AllocationResultsMaxSize`` in ``staging/src/k8s.io/api/resource/v1/types.go``): a selector the apiserver
rejects, ``>=`` on a quantity or version, an attribute no device publishes, a single ``in [...]``
selector whose order means nothing, an unqualified constraint attribute, more than 32 devices in one
claim.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from claims.allocator.requests import SELECTOR_WITHOUT_CEL
from claims.cel import CelCompileError, compile_selector, parse_qualified_name

if TYPE_CHECKING:
    from claims.fleetstate import FleetState

Obj = dict[str, Any]
MAX_RESULTS = 32
_ORDERING = re.compile(r"(>=|<=|(?<![-=!<>])>(?!=)|<(?!=))")
_IN_LIST = re.compile(r"\bin\s*\[([^\]]*)\]")


@dataclass(frozen=True)
class Finding:
    """One lint finding: ``code``, ``severity`` (error|warning|info), where (request or selector)."""

    code: str
    severity: str
    where: str
    message: str
    expression: str = ""
    suggestion: str = ""

    def as_dict(self) -> Obj:
        return asdict(self)


def published_names(state: FleetState | None) -> dict[str, dict[tuple[str, str], str]]:
    """kind -> {(domain, name): value type} over every device in the fleet (cached on the state)."""
    return _published(state)


def _published(state: FleetState | None) -> dict[str, dict[tuple[str, str], str]]:
    """kind -> {(domain, name): value type} over every device in the fleet."""
    if state is None:
        return {"attributes": {}, "capacity": {}}
    cached = getattr(state, "_lint_published", None)
    if isinstance(cached, dict):
        return cached
    out: dict[str, dict[tuple[str, str], str]] = {"attributes": {}, "capacity": {}}
    for kind, driver, name, value_type in state.published():
        out["attributes" if kind == "a" else "capacity"][parse_qualified_name(name, driver)] = value_type
    object.__setattr__(state, "_lint_published", out)
    return out


def _obj(value: Any) -> Obj:
    """``value`` if it is an object, else an empty one. Lint reads what it can and never raises on a
    malformed object: what-if callers reject bad shapes first (``fleet.normalize.check_claim_object``),
    with the field named, and a finding about half a claim beats a crash."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _spec_requests(obj: Obj) -> tuple[list[tuple[str, Obj]], list[Obj]]:
    """[(request name, exactly/subrequest spec)], constraints of a claim or template."""
    spec = _obj(obj.get("spec"))
    if obj.get("kind") == "ResourceClaimTemplate":
        spec = _obj(spec.get("spec"))
    devices = _obj(spec.get("devices"))
    out: list[tuple[str, Obj]] = []
    for request in map(_obj, _list(devices.get("requests"))):
        name = str(request.get("name", ""))
        if request.get("firstAvailable"):
            out += [(f"{name}/{s.get('name', '')}", s) for s in map(_obj, _list(request["firstAvailable"]))]
        else:
            out.append((name, _obj(request.get("exactly"))))
    return out, [_obj(c) for c in _list(devices.get("constraints"))]


def _selector_expressions(spec: Obj) -> list[str]:
    return [str(_obj(_obj(sel).get("cel")).get("expression") or "") for sel in _list(spec.get("selectors"))]


def _count(spec: Obj) -> int:
    count = spec.get("count", 1)
    return count if isinstance(count, int) and not isinstance(count, bool) else 1


def lint_selector(expression: str, where: str, state: FleetState | None) -> list[Finding]:
    """Findings for one CEL selector ("" for a selector without CEL)."""
    if not expression:
        # A selector of a type this API version does not know (written for a newer one): the allocator
        # aborts on it in these words. Compiling "" would call it a syntax error at the end of input.
        return [
            Finding(
                "selector-unsupported",
                "error",
                where,
                SELECTOR_WITHOUT_CEL,
                "",
                "resource.k8s.io/v1 knows only CEL selectors: write it as cel.expression, or write the "
                "claim for the cluster's resource.k8s.io version.",
            )
        ]
    try:
        selector = compile_selector(expression)
    except CelCompileError as exc:
        suggestion = ""
        if "(any, kubernetes.Quantity)" in exc.message:
            suggestion = (
                "Memory is a capacity, not an attribute: "
                "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0."
            )
        elif "kubernetes.Quantity" in exc.message and "found no matching overload" in exc.message:
            suggestion = (
                "Quantities have no ordering operators: use .compareTo(quantity('40Gi')) >= 0 "
                "or .isGreaterThan(...)."
            )
        return [Finding("cel-compile", "error", where, exc.message, expression, suggestion)]
    findings: list[Finding] = []
    published = _published(state)
    have_fleet = bool(published["attributes"] or published["capacity"])
    for kind, domain, name in sorted(selector.references):
        if not have_fleet or (domain, name) in published[kind]:
            if (
                kind == "attributes"
                and published["attributes"].get((domain, name)) == "version"
                and re.search(rf"\b{re.escape(name)}\s*(>=|<=|>|<)", expression)
            ):
                findings.append(
                    Finding(
                        "version-ordering",
                        "error",
                        where,
                        f"{name} is a version: ordering operators fail at runtime (SchedulerError).",
                        expression,
                        f"Use device.attributes['{domain}'].{name}.compareTo(semver('9.0.0')) >= 0.",
                    )
                )
            continue
        other = "capacity" if kind == "attributes" else "attributes"
        if (domain, name) in published[other]:
            findings.append(
                Finding(
                    "wrong-map",
                    "error",
                    where,
                    f"{name} is published as a {'capacity' if other == 'capacity' else 'attribute'}, "
                    f"not in device.{kind}.",
                    expression,
                    f"Use device.{other}['{domain}'].{name}"
                    + (".compareTo(quantity('40Gi')) >= 0." if other == "capacity" else "."),
                )
            )
            continue
        names = [n for (d, n) in published[kind] if d == domain] or [n for (_, n) in published[kind]]
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        findings.append(
            Finding(
                "unknown-attribute",
                "warning",
                where,
                f"No device in the fleet publishes {'capacity' if kind == 'capacity' else 'attribute'} "
                f"{domain}/{name}; "
                "on a device of that domain the selector fails at runtime (no such key).",
                expression,
                f"Did you mean {close[0]!r}?" if close else "Guard it with has(...) or .?name.orValue(...).",
            )
        )
    for match in _IN_LIST.finditer(expression):
        items = [x for x in match.group(1).split(",") if x.strip()]
        if len(items) >= 2:
            findings.append(
                Finding(
                    "in-list-order",
                    "info",
                    where,
                    f"`in [{match.group(1).strip()}]` accepts any of {len(items)} values; "
                    "the list order is not a "
                    "preference (devices are taken in name order).",
                    expression,
                    "To express a preference, use firstAvailable with one subrequest per value, best first.",
                )
            )
    return findings


def lint_object(obj: Obj, state: FleetState | None = None) -> list[Finding]:
    """Findings for a claim, a template or a device class."""
    if obj.get("kind") == "DeviceClass":
        out: list[Finding] = []
        for i, expr in enumerate(_selector_expressions(_obj(obj.get("spec")))):
            out += lint_selector(expr, f"selector #{i}", state)
        return out
    requests, constraints = _spec_requests(obj)
    findings: list[Finding] = []
    total = 0
    for name, spec in requests:
        for i, expr in enumerate(_selector_expressions(spec)):
            findings += lint_selector(expr, f"{name} selector #{i}", state)
        if (spec.get("allocationMode") or "ExactCount") == "ExactCount":
            count = _count(spec)
            if count > MAX_RESULTS:
                findings.append(
                    Finding(
                        "too-many",
                        "error",
                        name,
                        f"count {count} exceeds the claim limit of {MAX_RESULTS} devices.",
                        suggestion=f"Split into claims of at most {MAX_RESULTS} devices.",
                    )
                )
            if "/" not in name:
                total += count
    if total > MAX_RESULTS and not any(f.code == "too-many" for f in findings):
        findings.append(
            Finding(
                "too-many",
                "error",
                "claim",
                f"the requests add up to {total} devices; a claim holds at most {MAX_RESULTS}.",
                suggestion="Split the claim.",
            )
        )
    for i, constraint in enumerate(constraints):
        attr = constraint.get("matchAttribute") or constraint.get("distinctAttribute") or ""
        if not isinstance(attr, str):
            continue
        if attr and "/" not in attr:
            findings.append(
                Finding(
                    "unqualified-constraint",
                    "warning",
                    f"constraint #{i}",
                    f"constraint attribute {attr!r} is not qualified; it only matches devices whose driver "
                    "publishes it under its own domain.",
                    suggestion=f"Write the full name, e.g. 'gpu.nvidia.com/{attr}'.",
                )
            )
        if attr.endswith("pcieRoot"):
            findings.append(
                Finding(
                    "pcie-root",
                    "info",
                    f"constraint #{i}",
                    "NVIDIA HGX nodes have 2 GPUs per PCIe root: matchAttribute on pcieRoot caps the claim "
                    "at 2 GPUs.",
                    suggestion="All GPUs of a node already share the NVLink domain; drop the constraint for "
                    "4-8 GPUs.",
                )
            )
    return findings
