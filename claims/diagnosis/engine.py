"""The entry points: :func:`prepare` (per-fleet indexes, once per fleet change), :func:`diagnose` (a
claim, a template or a pod) and :func:`diagnose_name`; they run the other modules of this package in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from claims.allocator import (
    FILTER_ERROR,
    MAX_RESULTS,
    PREFILTER_ERROR,
    UNSUPPORTED,
    AllocationResult,
    allocate,
)
from claims.allocator.requests import SELECTOR_WITHOUT_CEL
from claims.cel import CelCompileError, compile_selector
from claims.diagnosis.analysis import analyze, summarize
from claims.diagnosis.binding import binding_suggestion, binding_waits
from claims.diagnosis.details import request_detail
from claims.diagnosis.extended import extended_resource_claim
from claims.diagnosis.groups import Context, summary_key
from claims.diagnosis.placement import fits_diagnosis, invalid_pools, place, pod_nodes
from claims.diagnosis.requests import Req, claim_from, make_req, requests_of, selector_texts
from claims.diagnosis.result import Diagnosis, Obj
from claims.diagnosis.wording import error_diagnosis, unschedulable
from claims.fleetstate import FleetState, claim_results, klog
from claims.lint import Finding, lint_object, published_names
from fleet.normalize import claim_as_v1, unsupported_api_version


def prepare(state: FleetState) -> FleetState:
    """Build every per-fleet index once (device groups, holders, counters, the allocator's slice index and
    in-use baseline, device states without tolerations), so that each diagnosis only pays for its own
    requests. Optional: ``diagnose`` builds what it needs lazily. Returns ``state``."""
    ctx = Context.of(state)
    published_names(state)
    nodes = state.node_names()
    if nodes:
        allocate([], nodes[0], state.snapshot)
    plain = Req("", "", {}, "", 1, False, [], [], [], {})
    holders = state.holders()
    for members in state.signature_groups():
        if len(members) > 1:
            key = summary_key(members, plain, None)
            if key not in ctx.summaries:
                ctx.summaries[key] = summarize(ctx, plain, members, holders)
    return state


def diagnose(
    state: FleetState,
    obj: Obj,
    pods_in: Callable[[str], bool] | None = None,
    pods: list[Obj] | None = None,
) -> Diagnosis:
    """Diagnose a ResourceClaim, a ResourceClaimTemplate (as the claim it would stamp) or a Pod.

    The pods using a claim (their node selector, the scheduler's message) are looked up only when
    ``pods_in(namespace)`` allows the claim's namespace (every namespace when None); otherwise the claim is
    diagnosed as no pod used it, like a template. What-if passes the user's visibility here. ``pods``
    gives a claim's pods instead of looking them up (a claim shape diagnosed under a made-up name)."""
    if obj.get("kind") == "Pod":
        return _diagnose_pod(state, obj)
    unsupported = unsupported_api_version(obj)
    if unsupported:
        return Diagnosis(
            "unsupported",
            f"{obj.get('kind', 'Object')} {klog(obj)}: {unsupported}.",
            claim=klog(obj),
            suggestions=["Write the claim for resource.k8s.io/v1 (or v1beta2/v1beta1)."],
        )
    obj = claim_as_v1(obj)
    claim = claim_from(obj)
    if pods is None:
        pods = []
        if obj.get("kind") == "ResourceClaim":
            namespace = str((claim.get("metadata") or {}).get("namespace") or "")
            if pods_in is None or pods_in(namespace):
                pods = state.pods_of_claim(claim)
    return _diagnose_claim(state, claim, pods[0] if pods else None, lint_object(obj, state))


def diagnose_name(state: FleetState, namespace: str, name: str) -> Diagnosis:
    """Diagnose the claim ``namespace/name``, else the pod of that name. Raises LookupError."""
    claim = state.find("ResourceClaim", namespace, name)
    if claim is not None:
        return diagnose(state, claim)
    pod = state.find("Pod", namespace, name)
    if pod is not None:
        return diagnose(state, pod)
    raise LookupError(f"no ResourceClaim or Pod {namespace}/{name} in the fleet")


def _diagnose_pod(state: FleetState, pod: Obj) -> Diagnosis:
    meta = pod.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    claims: list[Obj] = []
    for ref in (pod.get("spec") or {}).get("resourceClaims") or []:
        claim_name = ref.get("resourceClaimName") or statuses.get(ref.get("name"))
        if not claim_name:
            events = [
                e
                for e in state.events_for("Pod", ns, name)
                if e.get("reason") in ("FailedResourceClaimCreation", "FailedCreate")
            ]
            event = events[-1].get("message", "") if events else ""
            template = ref.get("resourceClaimTemplateName", "")
            missing = template and state.find("ResourceClaimTemplate", ns, template) is None
            summary = (
                f'Claim "{ref.get("name")}" of pod {ns}/{name} was never created from template {template}'
            )
            summary += f": {event}" if event else (": the template does not exist" if missing else "")
            suggestions = (
                [f"Create ResourceClaimTemplate {ns}/{template}, or fix the pod's resourceClaimTemplateName."]
                if missing
                else ["Check kube-controller-manager (resource-claim controller) events and logs."]
            )
            return Diagnosis(
                "not-created",
                summary + ".",
                suggestions=suggestions,
                pod=f"{ns}/{name}",
                scheduler_message=f'pod "{ns}/{name}": ResourceClaim not created yet',
            )
        claim = state.find("ResourceClaim", ns, claim_name)
        if claim is None:
            return Diagnosis(
                "not-created",
                f"ResourceClaim {ns}/{claim_name} used by pod {ns}/{name} does not exist.",
                suggestions=[f"Create ResourceClaim {ns}/{claim_name} or fix the pod spec."],
                pod=f"{ns}/{name}",
                scheduler_message=f'could not find ResourceClaim "{ns}/{claim_name}"',
            )
        claims.append(claim)
    pending = [c for c in claims if not claim_results(c)]
    extended = extended_resource_claim(state, pod)
    if extended is not None:
        pending.append(extended)  # the scheduler allocates it together with the pod's own claims
    if not pending:
        waits = [w for c in claims for w in binding_waits(c)]
        summary = f"All claims of pod {ns}/{name} are allocated."
        if waits and not (pod.get("spec") or {}).get("nodeName"):
            summary += " The scheduler binds the pod once the devices' binding conditions hold: "
            summary += "; ".join(waits) + "."
        return Diagnosis("fits", summary, suggestions=binding_suggestion(waits), pod=f"{ns}/{name}")
    return _diagnose_claim(state, pending[0], pod, lint_object(pending[0], state), others=pending[1:])


@dataclass(frozen=True)
class UnknownShape:
    """A claim shape this scheduler does not know, as it reports it: ``message`` its words, ``prefix`` the
    framework's words around them for where it stops (:data:`PREFILTER_ERROR`, :data:`FILTER_ERROR`, or
    :data:`PREFILTER_UNSCHEDULABLE`)."""

    message: str
    prefix: str

    @property
    def scheduler_message(self) -> str:
        return self.prefix + self.message


# No prefix: PreFilter's status for a request of no known type is UnschedulableAndUnresolvable, not an
# error. The pod waits, with this message as its reason, until the claim changes.
PREFILTER_UNSCHEDULABLE = ""


def unknown_shape(claim: Obj, classes: dict[str, Obj]) -> UnknownShape | None:
    """How the scheduler stops on a claim of a shape this version does not know (a request type, a request
    without a class, a selector without CEL); None when there is none, or when a class is missing first
    (the class check reports it). ``classes``: the fleet's device classes by name.

    In the scheduler's order: its PreFilter checks every request's type and classes, request by request
    (kube-scheduler's ``DynamicResources.PreFilter``, ``validateDeviceClass``), before the allocator reads
    any selector in Filter."""
    name = klog(claim)
    requests = ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
    every = requests_of(claim)
    for request, alternatives in zip(requests, every, strict=True):
        if not request.get("exactly") and not request.get("firstAvailable"):
            message = f"resource claim {name}, request {request.get('name', '')}: unknown request type"
            return UnknownShape(message, PREFILTER_UNSCHEDULABLE)
        for item in alternatives:
            class_name = item["spec"].get("deviceClassName")
            if not class_name:
                return UnknownShape(f"request {item['name']}: unsupported request type", PREFILTER_ERROR)
            if class_name not in classes:
                return None
    for alternatives in every:
        for item in alternatives:
            spec = item["spec"]
            class_spec = classes[spec["deviceClassName"]].get("spec") or {}
            # The request's selectors, then its class's, numbered each from 0 as the allocator does.
            for texts in (selector_texts(spec), selector_texts(class_spec)):
                for i, text in enumerate(texts):
                    if not text:
                        message = (
                            f"claim {name}, request {item['name']}, selector #{i}: {SELECTOR_WITHOUT_CEL}"
                        )
                        return UnknownShape(message, FILTER_ERROR)
    return None


def _diagnose_claim(
    state: FleetState, claim: Obj, pod: Obj | None, findings: list[Finding], others: list[Obj] | None = None
) -> Diagnosis:
    name = klog(claim)
    base = Diagnosis(
        "",
        "",
        lint=[f.as_dict() for f in findings],
        claim=name,
        pod=klog(pod) if pod else "",
    )
    if claim_results(claim):
        base.category = "fits"
        base.summary = f"{name} is already allocated ({len(claim_results(claim))} devices)."
        waits = binding_waits(claim)
        if waits:
            base.summary += " Binding conditions pending: " + "; ".join(waits) + "."
            base.suggestions = binding_suggestion(waits)
        return base
    classes = {str((c.get("metadata") or {}).get("name", "")): c for c in state.objects["DeviceClass"]}
    # 0. shapes the scheduler does not know (written for a newer API): it stops on them, and the checks
    # below would read them as a missing class or a selector that does not compile
    unknown = unknown_shape(claim, classes)
    if unknown:
        aborted = AllocationResult(ok=False, kind="error", message=unknown.message, reason=UNSUPPORTED)
        diagnosis = error_diagnosis(base, claim, aborted, [])
        diagnosis.scheduler_message = unknown.scheduler_message
        if unknown.prefix == PREFILTER_UNSCHEDULABLE:
            diagnosis.summary = (
                f"The scheduler marks the pod UnschedulableAndUnresolvable: {unknown.message}."
            )
        return diagnosis
    # 1. compile errors (the apiserver would reject the claim; a stored one aborts scheduling)
    for f in findings:
        if f.code == "cel-compile":
            base.category = "cel-error"
            base.summary = f"Selector of request {f.where} does not compile: {f.message.splitlines()[0]}"
            base.requests = [{"name": f.where, "expression": f.expression, "error": f.message}]
            base.suggestions = [f.suggestion] if f.suggestion else []
            return base
    # 2. classes
    requests = requests_of(claim)
    for alternatives in requests:
        for item in alternatives:
            cname = item["spec"].get("deviceClassName", "")
            if cname not in classes:
                base.category = "class-missing"
                base.summary = (
                    f"Request {item['name']} asks for device class {cname!r}, which does not exist."
                )
                base.scheduler_message = f"request {item['name']}: device class {cname} does not exist"
                known = ", ".join(sorted(classes)) or "none"
                base.suggestions = [
                    f"Use an existing class ({known}) or install the driver's DeviceClass {cname}."
                ]
                return base
    # 3. too many
    minimum = sum(
        min(
            int(i["spec"].get("count", 1))
            if (i["spec"].get("allocationMode") or "ExactCount") == "ExactCount"
            else 1
            for i in alts
        )
        for alts in requests
    )
    if minimum > MAX_RESULTS:
        base.category = "too-many"
        base.summary = f"{name} asks for at least {minimum} devices; a claim holds at most {MAX_RESULTS}."
        base.suggestions = [f"Split it into several claims of at most {MAX_RESULTS} devices each."]
        return base
    if not requests:  # nothing to allocate: no fleet, however empty, can keep it pending
        base.category = "fits"
        base.summary = f"{name} requests no devices: there is nothing to allocate."
        return base
    # 4. class selectors: stored classes are not re-validated, the allocator aborts on them (isSelectable)
    for alternatives in requests:
        for item in alternatives:
            cname = item["spec"].get("deviceClassName", "")
            for i, expression in enumerate(selector_texts(classes[cname].get("spec") or {})):
                try:
                    compile_selector(expression)
                except CelCompileError as exc:
                    base.category = "cel-error"
                    base.summary = f"Selector #{i} of device class {cname} does not compile: {exc.message}"
                    base.scheduler_message = (
                        f'running "DynamicResources" filter plugin: class {cname}: selector #{i}: '
                        f"CEL compile error: {exc.message}"
                    )
                    base.requests = [{"name": item["name"], "expression": expression, "error": exc.message}]
                    base.suggestions = [f"Fix DeviceClass {cname}: every claim using it fails to schedule."]
                    return base
    # 5. per-device analysis + allocator replay
    ctx = Context.of(state)
    nodes = pod_nodes(state, pod)
    analyses = [[analyze(ctx, make_req(item, classes), nodes) for item in alts] for alts in requests]
    base.requests = [request_detail(state, a) for alts in analyses for a in alts]
    node, result, _ = place(state, [claim, *(others or [])], analyses, nodes)
    if result is not None and result.ok and node is not None:
        return fits_diagnosis(state, base, claim, pod, node, result)
    if result is not None and result.kind == "error":
        return error_diagnosis(base, claim, result, analyses)
    base.scheduler_message = "cannot allocate all claims"
    invalid = invalid_pools(state, ctx, nodes)
    if invalid:
        # allocator: "invalid resource pools were encountered" when nothing fits on a node with one
        base.scheduler_message = "invalid resource pools were encountered"
        base.category = "pool"
        base.summary = (
            "The scheduler rejects the node(s) because of invalid resource pools: "
            + "; ".join(invalid[:3])
            + "."
        )
        base.suggestions = ["Fix the driver's ResourceSlices (each device name once per pool)."]
        return base
    return unschedulable(
        base,
        analyses,
        list(((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []),
        len(others or []),
    )
