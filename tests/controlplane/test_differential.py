"""Differential test: claimscope's diagnosis engine against the real kube-scheduler (v1.37.2).

1,000 random cases per run (``CLAIMSCOPE_DIFF_CASES``) from a new seed every run (printed; set
``CLAIMSCOPE_DIFF_SEED`` to reproduce one): models, static MIG layouts, dynamic MIG counters, taints and
tolerations, devices already held by another claim, incomplete pools, firstAvailable,
matchAttribute/distinctAttribute, count and All, capacity requests, selectors that abort scheduling,
DeviceTaintRules over the case's pools (tolerated or not), devices with binding conditions. Each
case lives on its own nodes (the pod's nodeSelector), so all cases are scheduled in one batch on one control
plane. For every case the engine's verdict (fits / unschedulable / SchedulerError) must equal the
scheduler's; the engine's placement and the scheduler's allocation must both pass an independent validator,
and on single-node cases they must be the same devices. Disagreements that could not be fixed are recorded
in FINDINGS.md.

A disagreement prints the case as YAML and adds ``SEED INDEX`` to ``regression_cases.txt``; every case
listed there is scheduled again on every run (commit the file with the fix).
"""

from __future__ import annotations

import os
import random
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from claims.diagnosis import diagnose
from claims.fleetstate import FleetState
from fleet.normalize import claim_as_v1
from simulator import nvidia
from tests.controlplane.diffgen import (
    CASE_LABEL,
    Case,
    as_api_version,
    case_features,
    make_case,
    validate_allocation,
)
from tests.controlplane.kube import ApiError, Kube, Obj, wait_for
from tests.controlplane.nodes import for_create, register_node
from tests.controlplane.publisher import FleetPublisher

pytestmark = pytest.mark.controlplane

CASES = int(os.environ.get("CLAIMSCOPE_DIFF_CASES") or 1000)
REGRESSIONS = Path(__file__).with_name("regression_cases.txt")
LOG = Path(__file__).resolve().parents[2] / ".artifacts" / "differential.log"


def _seed() -> int:
    given = os.environ.get("CLAIMSCOPE_DIFF_SEED")
    return int(given) if given else secrets.randbelow(2**31)


def generate(seed: int, count: int) -> list[Case]:
    rng = random.Random(seed)
    return [make_case(rng, i, seed) for i in range(count)]


def regression_cases() -> list[tuple[int, int, Case]]:
    """(seed, index, case) of every ``SEED INDEX [base]`` line of regression_cases.txt, renumbered so that
    cases of several seeds can share one batch (names do not change what the generator draws). ``base``: the
    case as the first generator drew it, without the features added later (see ``make_case``)."""
    wanted: list[tuple[int, int, bool]] = []
    for line in REGRESSIONS.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            wanted.append((int(fields[0]), int(fields[1]), "base" in fields[2:]))
    out = []
    for number, (seed, index, base) in enumerate(wanted):
        rng = random.Random(seed)
        for i in range(index):
            make_case(rng, i)
        case = make_case(rng, index, None if base else seed, number=100_000 + number)
        out.append((seed, index, case))
    return out


def _publish(kube: Kube, publisher: FleetPublisher, case: Case) -> None:
    """The case's DeviceTaintRules (first, so that the scheduler has them long before the pod), nodes and
    slices. Everything here is cluster-scoped: the ``kube`` fixture deletes it after the test."""
    for rule in case.rules:
        kube.create(for_create(rule))
    stored = {}
    for node in case.nodes:
        stored[node["metadata"]["name"]] = register_node(kube, node)
    for s in case.slices:
        if s["spec"].get("nodeName"):
            publisher.publish_slice(s, stored[s["spec"]["nodeName"]])
        else:  # a node-less pool has no owner node
            kube.create(for_create(s))


def _held_claim(ns: str, case: Case) -> Obj:
    node = case.held[0]["pool"]  # held devices all come from the first node's pool
    spec_request = nvidia.exactly_request("held", "gpu.nvidia.com", len(case.held))
    claim = nvidia.claim_object(ns, f"held-{case.index}", [spec_request])
    claim["status"] = nvidia.allocation_status(case.held, node)
    for result, held in zip(claim["status"]["allocation"]["devices"]["results"], case.held, strict=True):
        for key in ("shareID", "consumedCapacity"):
            if key in held:
                result[key] = held[key]
    return claim


def _create_held(kube: Kube, claim: Obj) -> None:
    created = kube.create(for_create(claim))
    kube.patch(
        "ResourceClaim",
        created["metadata"]["name"],
        {"status": claim["status"]},
        namespace=created["metadata"]["namespace"],
        subresource="status",
    )


def _pod(ns: str, case: Case) -> Obj:
    """The case's pod: its claim templates, or nvidia.com/gpu in its limits (DRA extended resource)."""
    claims: list[tuple[str, str | dict[str, str]]] = []
    if not case.extended:
        claims.append(("gpus", case.name))
        claims += [(f"x{k}", f"{case.name}-x{k}") for k in range(len(case.extra_requests))]
    pod = nvidia.pod_object(ns, case.name, claims)
    pod["spec"]["nodeSelector"] = {CASE_LABEL: str(case.index)}
    if case.extended:
        pod["spec"].pop("resourceClaims", None)
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(case.extended)}}
    return for_create(pod)


def _templates(ns: str, case: Case) -> list[Obj]:
    """The case's templates as created: the main one in the case's API version, then the extra ones."""
    main = nvidia.claim_template(ns, case.name, case.requests, case.constraints)
    extra = [nvidia.claim_template(ns, f"{case.name}-x{k}", [r]) for k, r in enumerate(case.extra_requests)]
    return [as_api_version(main, case.api_version) if case.api_version != "v1" else main, *extra]


def _create_template(kube: Kube, template: Obj) -> None:
    version = template["apiVersion"]
    ns = template["metadata"]["namespace"]
    kube.request("POST", f"/apis/{version}/namespaces/{ns}/resourceclaimtemplates", for_create(template))


BINDING_PENDING = "allocated, waiting for binding conditions"


def _verdict(pod: Obj) -> tuple[str, str] | None:
    if pod["spec"].get("nodeName"):
        return "fits", ""
    scheduled = False
    for cond in pod.get("status", {}).get("conditions", []):
        if cond["type"] != "PodScheduled":
            continue
        scheduled = True
        if cond["status"] != "False":
            continue
        message = cond.get("message", "")
        if cond.get("reason") == "SchedulerError" and "DynamicResources" in message:
            return "error", message
        if cond.get("reason") == "Unschedulable" and "nodes are available" in message:
            return "unschedulable", message
    if not scheduled and pod.get("status", {}).get("nominatedNodeName"):
        # Devices with binding conditions: the claims are allocated and the pod waits in PreBind until a
        # binding controller (none here) sets the conditions; no PodScheduled condition yet (FINDINGS.md).
        return "fits", BINDING_PENDING
    return None


def _engine(case: Case, ns: str, template: Obj, classes: list[Obj]) -> tuple[str, Any]:
    objs: list[Obj] = [*classes, *case.nodes, *case.slices, *case.rules]
    if case.held:
        objs.append(_held_claim(ns, case))
    if case.extended or case.extra_requests:
        # Diagnose the pod: its claims as the resource-claim controller would stamp them (by name here).
        pod = _pod(ns, case)
        pod["metadata"]["uid"] = f"uid-{case.name}"
        if case.extended:
            objs.append(pod)
        else:
            names = [case.name] + [f"{case.name}-x{k}" for k in range(len(case.extra_requests))]
            pod["spec"]["resourceClaims"] = [
                {"name": ref["name"], "resourceClaimName": name}
                for ref, name in zip(pod["spec"]["resourceClaims"], names, strict=True)
            ]
            objs.append(pod)
            for t in _templates(ns, case):
                objs.append(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceClaim",
                        "metadata": {
                            "namespace": ns,
                            "name": t["metadata"]["name"],
                            "uid": f"uid-{t['metadata']['name']}",
                        },
                        "spec": claim_as_v1(t)["spec"]["spec"],
                    }
                )
        result = diagnose(FleetState.from_objects(objs), pod)
    else:
        result = diagnose(FleetState.from_objects(objs), template)
    if result.category == "fits":
        return "fits", result
    if result.scheduler_message.startswith('running "DynamicResources"') or result.category == "cel-error":
        return "error", result
    return "unschedulable", result


def _scheduler_allocation(kube: Kube, ns: str, pod: Obj) -> Obj:
    statuses = pod["status"]["resourceClaimStatuses"]
    name = next(s["resourceClaimName"] for s in statuses if s["name"] == "gpus")
    allocation: Obj = kube.get("ResourceClaim", name, ns)["status"]["allocation"]
    return allocation


def _case_yaml(case: Case, ns: str, template: Obj) -> str:
    objs: list[Obj] = [*case.rules, *case.nodes, *case.slices]
    if case.held:
        objs.append(_held_claim(ns, case))
    objs += [template, *_templates(ns, case)[1:], _pod(ns, case)]
    return yaml.safe_dump_all(objs, sort_keys=False)


def _run_batch(kube: Kube, namespace: str, cases: list[Case]) -> tuple[list[str], dict[str, int], Obj]:
    """Schedule ``cases`` in one batch and compare. Returns (disagreements, scheduler verdicts,
    per-feature agreement {feature: [cases, agreeing]})."""
    publisher = FleetPublisher(kube)
    publisher.device_classes()
    classes = nvidia.device_classes()
    for case in cases:
        _publish(kube, publisher, case)
        if case.held:
            _create_held(kube, _held_claim(namespace, case))
    # adminAccess requests are only admitted in a namespace with this label
    kube.patch(
        "Namespace", namespace, {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}}
    )
    templates: dict[int, Obj] = {}
    rejected: dict[int, str] = {}
    for case in cases:
        made = _templates(namespace, case)
        try:
            for template in made:
                _create_template(kube, template)
        except ApiError as err:
            rejected[case.index] = str(err)
            continue
        templates[case.index] = made[0]
        kube.create(_pod(namespace, case))

    def all_decided() -> dict[str, Obj] | None:
        pods = {p["metadata"]["name"]: p for p in kube.list("Pod", namespace)}
        undecided = [n for n, p in pods.items() if _verdict(p) is None]
        return None if undecided or len(pods) < len(templates) else pods

    pods = wait_for(
        f"the scheduler's verdict on {len(templates)} pods",
        all_decided,
        timeout=120 + len(templates),
        interval=2.0,
    )

    disagreements: list[str] = []
    verdicts: dict[str, int] = {}
    by_feature: dict[str, list[int]] = {}
    for case in cases:
        template = templates.get(case.index) or _templates(namespace, case)[0]
        problem = _compare(kube, namespace, case, template, pods.get(case.name), rejected, classes, verdicts)
        for feature in case_features(case):
            tally = by_feature.setdefault(feature, [0, 0])
            tally[0] += 1
            tally[1] += problem is None
        if problem is not None:
            disagreements.append(
                f"{problem}\n--- {case.name} as YAML:\n{_case_yaml(case, namespace, template)}"
            )
    return disagreements, verdicts, by_feature


def _compare(
    kube: Kube,
    namespace: str,
    case: Case,
    template: Obj,
    pod: Obj | None,
    rejected: dict[int, str],
    classes: list[Obj],
    verdicts: dict[str, int],
) -> str | None:
    """The disagreement of one case, or None."""
    if case.index in rejected:
        outcome, _ = _engine(case, namespace, template, classes)
        verdicts["rejected"] = verdicts.get("rejected", 0) + 1
        if outcome != "error":
            return (
                f"{case.name}: apiserver rejected the template ({rejected[case.index]}), "
                f"engine says {outcome}"
            )
        return None
    assert pod is not None
    seen = _verdict(pod)
    assert seen is not None
    outcome, result = _engine(case, namespace, template, classes)
    if seen[0] == "error" and "timed out trying to allocate devices" in seen[1]:
        # The Filter timeout (DRASchedulerFilterTimeout, 10 s) depends on the machine's load, not on the
        # case: the engine does not model time. Counted and printed, not compared (FINDINGS.md).
        verdicts["filter-timeout"] = verdicts.get("filter-timeout", 0) + 1
        print(f"{case.name}: scheduler timed out (engine: {outcome}): {seen[1]}")
        return None
    verdicts[seen[0]] = verdicts.get(seen[0], 0) + 1
    if seen[1] == BINDING_PENDING:
        verdicts["of which binding pending"] = verdicts.get("of which binding pending", 0) + 1
    if outcome != seen[0]:
        return (
            f"{case.name}: engine {outcome} ({result.category}: {result.summary}); "
            f"scheduler {seen[0]} {seen[1]}"
        )
    if outcome != "fits" or case.extended:
        return None  # the extended resource claim's requests are the scheduler's: verdict only
    real = _scheduler_allocation(kube, namespace, pod)
    engine_problems = validate_allocation(
        result.placement["allocation"],
        case.requests,
        case.constraints,
        case.slices,
        classes,
        case.held,
        case.rules,
    )
    real_problems = validate_allocation(
        real, case.requests, case.constraints, case.slices, classes, case.held, case.rules
    )
    if engine_problems or real_problems:
        return f"{case.name}: invalid allocation: engine {engine_problems}, real {real_problems}"
    picked = sorted((r["request"], r["pool"], r["device"]) for r in result.placement["devices"])
    chosen = sorted((r["request"], r["pool"], r["device"]) for r in real["devices"]["results"])
    if len(case.nodes) == 1 and picked != chosen:
        # One node: no scoring between nodes, so first-fit must pick exactly the same devices.
        return f"{case.name}: same node, other devices: engine {picked}, scheduler {chosen}"
    return None


def _report(
    capsys: pytest.CaptureFixture[str], label: str, seconds: float, verdicts: dict[str, int], by_feature: Obj
) -> None:
    """Print the run's figures past pytest's capture (a passing run's seed is part of the evidence), and
    keep them in ``.artifacts/differential.log``."""
    figures = ", ".join(f"{f} {ok}/{n}" for f, (n, ok) in sorted(by_feature.items()))
    line = (
        f"differential {label}: {seconds:.0f} s, scheduler verdicts {verdicts}; "
        f"agreement per feature: {figures}"
    )
    with capsys.disabled():
        print(f"\n{line}")
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as out:
        out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n")


def test_engine_verdicts_agree_with_the_real_scheduler(
    kube: Kube, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = _seed()
    with capsys.disabled():
        print(f"\ndifferential seed {seed} ({CASES} cases); reproduce with CLAIMSCOPE_DIFF_SEED={seed}")
    started = time.monotonic()
    cases = generate(seed, CASES)
    disagreements, verdicts, by_feature = _run_batch(kube, namespace, cases)
    _report(capsys, f"seed {seed} ({CASES} cases)", time.monotonic() - started, verdicts, by_feature)
    if disagreements:
        failing = [int(d.split(":", 1)[0].removeprefix("case-")) for d in disagreements]
        with REGRESSIONS.open("a") as out:
            out.writelines(f"{seed} {index}  # found {time.strftime('%Y-%m-%d')}\n" for index in failing)
        print(f"added {len(failing)} case(s) of seed {seed} to {REGRESSIONS.name}")
    assert not disagreements, f"seed {seed}:\n" + "\n".join(disagreements)
    # The generator must exercise every verdict, or the agreement means little.
    assert (
        verdicts.get("fits", 0) >= CASES // 10
        and verdicts.get("unschedulable", 0) >= CASES // 10
        and verdicts.get("error", 0) >= 2
    ), verdicts


def test_every_regression_case_still_agrees(
    kube: Kube, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    listed = regression_cases()
    assert listed, f"{REGRESSIONS.name} lists no case"
    started = time.monotonic()
    disagreements, verdicts, by_feature = _run_batch(kube, namespace, [case for _, _, case in listed])
    _report(capsys, f"regressions ({len(listed)} cases)", time.monotonic() - started, verdicts, by_feature)
    names = {case.name: f"seed {seed} case {index}" for seed, index, case in listed}
    ordered = {case.name for seed, index, case in listed if (seed, index) in order_dependent_cases()}
    disagreements = [d for d in disagreements if not _same_refusal(d, ordered)]
    assert not disagreements, "\n".join(f"{names[d.split(':', 1)[0]]}: {d}" for d in disagreements)


def order_dependent_cases() -> set[tuple[int, int]]:
    """(seed, index) of the lines flagged ``order``: cases where the scheduler refuses either with an error
    or as unschedulable depending on the order of the pool's slices. Upstream's GatherPools appends a
    pool's slices in the order its lister returns them (a map's), and an ``All`` request under a
    ``matchAttribute``/``distinctAttribute`` constraint errors on the first device the constraint refuses
    but only fails when a device before it is refused by its counters; the engine cannot know that order.
    For these, engine and scheduler must agree that the claim does not fit."""
    out = set()
    for line in REGRESSIONS.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields and "order" in fields[2:]:
            out.add((int(fields[0]), int(fields[1])))
    return out


def _same_refusal(disagreement: str, ordered: set[str]) -> bool:
    """An order-dependent case where one side errs and the other finds it unschedulable."""
    name, _, text = disagreement.partition(":")
    head = text.split("\n", 1)[0]
    refusals = ("engine error" in head and "scheduler unschedulable" in head) or (
        "engine unschedulable" in head and "scheduler error" in head
    )
    return name in ordered and refusals
