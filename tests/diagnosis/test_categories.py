"""One behaviour per diagnosis category, on small simulated NVIDIA fleets."""

from __future__ import annotations

import copy

import pytest

from claims.diagnosis import diagnose, diagnose_name, explain_miss, prepare, split_conjuncts
from claims.fleetstate import FleetState
from simulator import nvidia
from tests.diagnosis.fleet import CAP, GPU, claim, held, node, state

MEM_150 = f"{CAP}.memory.compareTo(quantity('150Gi')) >= 0"


def gpu(count: int = 1, selectors: tuple[str, ...] = (), **kwargs: object) -> dict[str, object]:
    return nvidia.exactly_request("gpu", "gpu.nvidia.com", count, selectors, **kwargs)  # type: ignore[arg-type]


def test_a_claim_that_fits_gets_the_node_and_the_devices_the_scheduler_would_pick() -> None:
    fleet = state(node("a", "H100", gpus=2), held("old", "a", ["gpu-0"], "2026-03-06T10:00:00Z"))
    result = diagnose(fleet, claim([gpu()]))
    assert result.category == "fits"
    assert result.placement is not None
    assert result.placement["node"] == "a"
    assert [d["device"] for d in result.placement["devices"]] == ["gpu-1"]
    assert result.summary.startswith("Fits now on node a: 1 x H100 (gpu-1)")


def test_a_fitting_claim_whose_pod_failed_before_the_fleet_changed_waits_for_a_retry() -> None:
    pod = nvidia.pod_object(
        "team",
        "job",
        [("gpus", nvidia.from_claim("want"))],
        scheduled=nvidia.unschedulable_condition(
            nvidia.fit_error_message(1, {"cannot allocate all claims": 1}), "t"
        ),
    )
    pending = nvidia.claim_object("team", "want", [gpu()])
    result = diagnose(state(node("a", "H100", gpus=1), pod, pending), pending)
    assert result.category == "fits"
    assert "has not retried" in result.summary
    assert result.pod == "team/job"


def test_a_fitting_claim_pending_for_a_non_dra_reason_quotes_the_scheduler() -> None:
    message = "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    pod = nvidia.pod_object(
        "team",
        "job",
        [("gpus", nvidia.from_claim("want"))],
        scheduled=nvidia.unschedulable_condition(message, "t"),
    )
    pending = nvidia.claim_object("team", "want", [gpu()])
    result = diagnose(state(node("a", "H100", gpus=1), pod, pending), pending)
    assert result.category == "fits"
    assert f"non-DRA reason: {message}" in result.summary


def test_capacity_names_the_holders_oldest_first_and_flags_unreserved_ones() -> None:
    fleet = state(
        node("a", "B200", gpus=2),
        held("newer", "a", ["gpu-1"], "2026-03-07T10:00:00Z"),
        held("older", "a", ["gpu-0"], "2026-03-06T10:00:00Z", pod=None),
        node("h", "H100", gpus=4),
    )
    result = diagnose(fleet, claim([gpu(1, (MEM_150,))]))
    assert result.category == "capacity"
    assert "held by team/older, team/newer (oldest first)" in result.summary
    request = result.requests[0]
    assert [h["claim"] for h in request["holders"]] == ["team/older", "team/newer"]
    b200 = next(g for g in request["groups"] if g["model"] == "B200")
    assert b200["outcomes"] == {"allocated": 2}
    h100 = next(g for g in request["groups"] if g["model"] == "H100")
    assert h100["reason"] == "memory 80Gi < 150Gi on 4 H100"
    assert "team/older" in result.suggestions[0]  # allocated, reserved by nobody


def test_no_match_reports_the_nearest_misses_with_the_failing_clause_and_values() -> None:
    fleet = state(node("h", "H100", gpus=4), node("a", "A100", gpus=2))
    wanted = f"{GPU}.architecture == 'Hopper' && {MEM_150}"
    result = diagnose(fleet, claim([gpu(1, (wanted,))]))
    assert result.category == "no-match"
    assert "memory 80Gi < 150Gi on 4 H100" in result.summary
    groups = {g["model"]: g for g in result.requests[0]["groups"]}
    assert groups["H100"]["failing_clause"] == MEM_150
    assert groups["A100"]["failing_clause"] == f"{GPU}.architecture == 'Hopper'"
    assert "architecture 'Ampere' != 'Hopper'" in groups["A100"]["reason"]


def test_a_string_miss_says_what_the_device_has_and_what_was_wanted() -> None:
    fleet = state(node("h", "H100", gpus=2), node("a", "A100", gpus=2))
    wanted = f"{GPU}.productName in ['NVIDIA B200', 'NVIDIA B300']"
    result = diagnose(fleet, claim([gpu(1, (wanted,))]))
    assert result.category == "no-match"
    groups = {g["model"]: g for g in result.requests[0]["groups"]}
    assert groups["H100"]["reason"].startswith(
        "productName 'NVIDIA H100 80GB HBM3' not in ['NVIDIA B200', 'NVIDIA B300'] on 2 H100"
    )


def test_fragmentation_when_1g_slices_are_taken_and_bigger_slices_idle() -> None:
    layout = node("m", "H100", mode="static-mig", layout="balanced", gpus=1)
    small = [
        d["name"]
        for s in layout[1:]
        for d in s["spec"]["devices"]
        if d["attributes"]["profile"]["string"] == "1g.10gb"
    ]
    fleet = state(layout, held("chat", "m", small, "2026-03-06T10:00:00Z"))
    request = nvidia.exactly_request("gpu", "mig.nvidia.com", 1, [f"{GPU}.profile.startsWith('1g.')"])
    result = diagnose(fleet, claim([request]))
    assert result.category == "fragmentation"
    assert "1 x 3g.40gb" in result.summary and "1 x 2g.20gb" in result.summary
    assert result.requests[0]["idle_bigger_mig"] == {"2g.20gb": 1, "3g.40gb": 1}
    assert "firstAvailable" in result.suggestions[0]


def test_dynamic_mig_slices_blocked_by_used_counters_are_fragmentation() -> None:
    fleet_node = node("d", "H100", mode="dynamic-mig", gpus=1)
    fleet = state(fleet_node, held("big", "d", ["gpu-0-mig-4g40gb-5-0"], "2026-03-06T10:00:00Z"))
    request = nvidia.exactly_request("gpu", "mig.nvidia.com", 1, [f"{GPU}.profile == '7g.80gb'"])
    result = diagnose(fleet, claim([request]))
    assert result.category == "fragmentation"
    assert "blocked by their GPU's shared counters" in result.summary


def test_constraint_reports_free_devices_per_attribute_value() -> None:
    fleet = state(node("a", "H100", gpus=4))
    constraints = [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    result = diagnose(fleet, claim([gpu(4)], constraints))
    assert result.category == "constraint"
    detail = result.requests[-1]["constraints"][0]
    assert detail["free_per_value"] == {"a: pci0000:15": 2, "a: pci0000:37": 2}
    assert "at most 2 free devices share one" in result.summary


def test_taint_when_the_only_free_matching_devices_are_tainted() -> None:
    taint = {"key": "nvidia.com/gpu-health", "value": "xid-79", "effect": "NoSchedule"}
    fleet = state(node("a", "H100", gpus=2, taints={0: [taint], 1: [taint]}))
    result = diagnose(fleet, claim([gpu()]))
    assert result.category == "taint"
    assert "nvidia.com/gpu-health=xid-79:NoSchedule (2)" in result.summary
    tolerant = gpu(1, tolerations=[{"key": "nvidia.com/gpu-health", "operator": "Exists"}])
    assert diagnose(fleet, claim([tolerant])).category == "fits"


def test_taint_names_the_device_taint_rule_that_tainted_the_only_matching_device() -> None:
    taint = {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}
    rule = nvidia.device_taint_rule("drain-a-0", taint, driver="gpu.nvidia.com", pool="a", device="gpu-0")
    fleet = state(node("a", "H100", gpus=1), rule)
    result = diagnose(fleet, claim([gpu()]))
    assert result.category == "taint"
    assert "example.com/maintenance=planned:NoSchedule by DeviceTaintRule drain-a-0 (1)" in result.summary
    assert any("DeviceTaintRule drain-a-0" in s for s in result.suggestions)
    tolerant = gpu(1, tolerations=[{"key": "example.com/maintenance", "operator": "Exists"}])
    assert diagnose(fleet, claim([tolerant])).category == "fits"
    # A rule for another pool, or without a selector, taints nothing here.
    for other in (
        nvidia.device_taint_rule("elsewhere", taint, pool="b"),
        nvidia.device_taint_rule("no-selector", taint, selector=False),
    ):
        assert diagnose(state(node("a", "H100", gpus=1), other), claim([gpu()])).category == "fits"


def test_pool_when_matching_devices_sit_in_an_incomplete_pool() -> None:
    parts = node("a", "H100", gpus=1)
    parts[1]["spec"]["pool"]["resourceSliceCount"] = 2  # the second slice never arrived
    result = diagnose(state(parts), claim([gpu()]))
    assert result.category == "pool"
    assert "1 of 2 slices published" in result.summary


def test_class_missing_names_the_class_and_the_existing_ones() -> None:
    result = diagnose(
        state(node("a", "H100", gpus=1)), claim([nvidia.exactly_request("gpu", "gpu.example.com")])
    )
    assert result.category == "class-missing"
    assert result.scheduler_message == "request gpu: device class gpu.example.com does not exist"
    assert "mig.nvidia.com" in result.suggestions[0]


def test_cel_runtime_error_gives_the_schedulers_message_expression_and_attribute() -> None:
    expr = f"{GPU}.profile == '1g.10gb'"
    result = diagnose(state(node("full", "H100", gpus=1)), claim([gpu(1, (expr,))]))
    assert result.category == "cel-error"
    assert result.scheduler_message == (
        'running "DynamicResources" filter plugin: claim team/want: selector #0 on device '
        "gpu.nvidia.com/full/gpu-0: CEL runtime error: no such key: profile"
        + ". consider using CEL optional "
        "chaining (.? followed by orValue()) or guarding the check with has() for optional fields"
    )
    assert result.requests[0]["expression"] == expr
    assert result.requests[0]["attribute"] == "profile"


def test_cel_compile_error_quotes_the_apiserver_and_suggests_compare_to() -> None:
    expr = f"{CAP}.memory >= quantity('40Gi')"
    result = diagnose(state(node("a", "H100", gpus=1)), claim([gpu(1, (expr,))]))
    assert result.category == "cel-error"
    assert (
        "found no matching overload for '_>=_' applied to '(kubernetes.Quantity, kubernetes.Quantity)'"
        in (result.summary)
    )
    assert "compareTo" in result.suggestions[0]


def test_too_many_devices_in_one_claim() -> None:
    result = diagnose(state(node("a", "H100", gpus=8)), claim([gpu(40)]))
    assert result.category == "too-many"
    assert "at least 40 devices" in result.summary


def test_not_created_quotes_the_controllers_event() -> None:
    pod = nvidia.pod_object("team", "job", [("gpus", "missing-template")])
    event = nvidia.failed_claim_creation_event(
        pod, "gpus", 'resourceclaimtemplate.resource.k8s.io "missing-template" not found'
    )
    fleet = state(node("a", "H100", gpus=1), pod, event)
    result = diagnose_name(fleet, "team", "job")
    assert result.category == "not-created"
    assert event["message"] in result.summary
    assert "missing-template" in result.suggestions[0]


def test_first_available_falls_back_to_the_next_subrequest() -> None:
    request = nvidia.first_available_request(
        "gpu",
        [
            nvidia.subrequest("big", "gpu.nvidia.com", 1, [MEM_150]),
            nvidia.subrequest("any", "gpu.nvidia.com", 1),
        ],
    )
    result = diagnose(state(node("a", "H100", gpus=1)), claim([request]))
    assert result.category == "fits"
    assert result.placement is not None
    assert result.placement["devices"][0]["request"] == "gpu/any"


def test_a_template_is_diagnosed_as_the_claim_it_would_stamp() -> None:
    template = nvidia.claim_template("team", "t", [gpu(1, (MEM_150,))])
    result = diagnose(state(node("a", "H100", gpus=2)), template)
    assert result.category == "no-match"
    assert result.claim == "team/t"


def test_identical_devices_share_one_selector_evaluation() -> None:
    fleet = state(node("a", "H100", gpus=8), node("b", "H100", gpus=8))
    diagnose(fleet, claim([gpu(1, (MEM_150,))]))
    # two selectors (class + request), one distinct projection each over 16 identical-by-projection GPUs
    assert fleet.evaluations == 2
    assert fleet.saved == 30


def test_diagnosing_does_not_modify_the_input_objects() -> None:
    fleet = state(node("a", "H100", gpus=1))
    original = claim([gpu()])
    before = copy.deepcopy(original)
    diagnose(fleet, original)
    assert original == before


def test_unknown_names_raise_lookup_error() -> None:
    with pytest.raises(LookupError, match="team/nope"):
        diagnose_name(FleetState.from_objects([]), "team", "nope")


def test_split_conjuncts_respects_quotes_and_brackets() -> None:
    expr = "a && (b || c && d) && e.matches('x&&y') && f[\"&&\"]"
    assert split_conjuncts(expr) == ["a", "(b || c && d)", "e.matches('x&&y')", 'f["&&"]']


def test_explain_miss_reports_quantities_and_strings() -> None:
    fleet = state(node("a", "A100", gpus=1))
    info = fleet.devices()[0]
    assert explain_miss(info, f"{GPU}.architecture == 'Hopper' && {MEM_150}") == (
        f"{GPU}.architecture == 'Hopper'",
        "architecture 'Ampere' != 'Hopper'",
    )
    assert explain_miss(info, MEM_150) == (MEM_150, "memory 80Gi < 150Gi")


def test_a_cel_error_on_any_node_aborts_even_if_another_node_fits() -> None:
    # Like the scheduler's parallel Filter: the H100 node would fit, the B200 node raises.
    expr = f"{GPU}.productName == 'NVIDIA H100 80GB HBM3' || {GPU}.profile == '1g.10gb'"
    fleet = state(node("a-h100", "H100", gpus=1), node("b-b200", "B200", gpus=1))
    result = diagnose(fleet, claim([gpu(1, (expr,))]))
    assert result.category == "cel-error"
    assert "on device gpu.nvidia.com/b-b200/gpu-0" in result.scheduler_message


def test_prepared_and_lazy_states_give_the_same_diagnoses() -> None:
    def build() -> FleetState:
        return state(
            node("a", "B200", gpus=2),
            node("m", "H100", mode="dynamic-mig", gpus=1),
            held("x", "a", ["gpu-0"], "2026-03-06T10:00:00Z"),
        )

    claims = [
        claim([gpu(1, (MEM_150,))]),
        claim([gpu(2)]),
        claim([nvidia.exactly_request("gpu", "mig.nvidia.com", 2, [f"{GPU}.profile.startsWith('3g.')"])]),
    ]
    lazy, prepared = build(), prepare(build())
    assert [diagnose(prepared, c).as_dict() for c in claims] == [diagnose(lazy, c).as_dict() for c in claims]


def test_selectors_are_not_evaluated_on_devices_already_in_use() -> None:
    # Both full GPUs are held: the scheduler skips them before their selectors run, so no CEL error.
    fleet = state(
        node("a", "A100", gpus=2),
        held("x", "a", ["gpu-0", "gpu-1"], "2026-03-06T10:00:00Z"),
        node("m", "H100", mode="static-mig", layout="balanced", gpus=1),
    )
    result = diagnose(fleet, claim([gpu(1, (f"{GPU}.profile.startsWith('1g.')",))]))
    assert result.category == "capacity"
    assert result.scheduler_message == "cannot allocate all claims"


def test_a_node_whose_later_subrequest_would_raise_still_fits_on_the_first() -> None:
    request = nvidia.first_available_request(
        "gpu",
        [
            nvidia.subrequest("any", "gpu.nvidia.com", 1),
            nvidia.subrequest("mig", "gpu.nvidia.com", 2, [f"{GPU}.profile.startsWith('1g.')"]),
        ],
    )
    fleet = state(node("a", "A100", gpus=2), held("x", "a", ["gpu-0"], "2026-03-06T10:00:00Z"))
    result = diagnose(fleet, claim([request]))
    assert result.category == "fits"
    assert result.placement is not None
    assert [(d["request"], d["device"]) for d in result.placement["devices"]] == [("gpu/any", "gpu-1")]


def test_all_mode_on_an_incomplete_pool_aborts_like_the_scheduler() -> None:
    parts = node("a", "H100", gpus=1)
    parts[1]["spec"]["pool"]["resourceSliceCount"] = 2
    result = diagnose(state(parts, node("b", "H100", gpus=1)), claim([gpu(allocation_mode="All")]))
    assert result.category == "pool"
    assert result.scheduler_message.endswith(
        "request gpu: asks for all devices, but resource pool gpu.nvidia.com/a is currently being updated"
    )


@pytest.mark.parametrize("name", ["want", "gpu-constraint"])
def test_an_abort_is_categorized_by_its_reason_whatever_the_claim_is_named(name: str) -> None:
    # The scheduler's message holds the claim's name: a name holding "constraint" (the one abort word a
    # DNS name can hold) must not change the category of an unsupported allocation mode.
    result = diagnose(state(node("a", "H100", gpus=1)), claim([gpu(allocation_mode="Some")], name=name))
    # A mode newer than the scheduler's: the fix is the cluster's version or the claim, not its CEL.
    assert result.category == "unsupported"
    assert result.scheduler_message.endswith(f"claim team/{name}, request gpu: unsupported count mode Some")
    assert "resource.k8s.io version" in result.suggestions[0]


@pytest.mark.parametrize(
    ("request_", "scheduler_message"),
    [
        # PreFilter's UnschedulableAndUnresolvable status: the pod's reason as it is (kube-scheduler
        # v1.37.2, DynamicResources.PreFilter's "unknown request type").
        ({"name": "gpu"}, "resource claim team/want, request gpu: unknown request type"),
        # PreFilter's error (validateDeviceClass), wrapped by the framework's PreFilter prefix.
        (
            {"name": "gpu", "exactly": {"count": 1}},
            'running PreFilter plugin "DynamicResources": request gpu: unsupported request type',
        ),
        # The allocator's error in Filter, wrapped by the framework's Filter prefix.
        (
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{"other": {}}]}},
            'running "DynamicResources" filter plugin: claim team/want, request gpu, selector #0: CEL '
            "expression empty (unsupported selector type?)",
        ),
    ],
)
def test_a_request_of_a_shape_the_allocator_does_not_know_is_unsupported_in_the_schedulers_words(
    request_: dict[str, object], scheduler_message: str
) -> None:
    # Written for a newer API (a request or selector type this version drops): the scheduler (its
    # PreFilter, then the allocator) stops with these words; the fix is the cluster's version or the
    # claim, not a class or a CEL expression.
    result = diagnose(state(node("a", "H100", gpus=1)), claim([request_]))
    assert (result.category, result.scheduler_message) == ("unsupported", scheduler_message)
    assert "feature gate" in result.suggestions[0]
    # Only the errors abort the attempt; the unknown type leaves the pod unschedulable.
    aborts = scheduler_message.startswith("running ")
    assert result.summary.startswith("Scheduling aborts (SchedulerError): ") == aborts
    assert result.summary.startswith("The scheduler marks the pod UnschedulableAndUnresolvable: ") != aborts


def test_a_missing_class_is_reported_before_a_selector_of_an_unknown_type() -> None:
    # The scheduler's PreFilter checks every request's class before the allocator reads any selector,
    # the selectors of an earlier request included.
    request_ = {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com", "selectors": [{}]}}
    result = diagnose(state(node("a", "H100", gpus=1)), claim([request_]))
    assert result.category == "class-missing"
    first = {"name": "a", "exactly": {"deviceClassName": "gpu.nvidia.com", "selectors": [{}]}}
    second = {"name": "b", "exactly": {"deviceClassName": "gpu.example.com"}}
    result = diagnose(state(node("a", "H100", gpus=1)), claim([first, second]))
    assert result.category == "class-missing"
    assert result.scheduler_message == "request b: device class gpu.example.com does not exist"


def test_a_claim_constraint_the_devices_cannot_meet_aborts_as_a_constraint() -> None:
    # All mode must take every matching device, and no two GPUs share a uuid.
    constraint = {"requests": ["gpu"], "matchAttribute": "gpu.nvidia.com/uuid"}
    result = diagnose(state(node("a", "H100", gpus=2)), claim([gpu(allocation_mode="All")], [constraint]))
    assert result.category == "constraint"
    assert "because a claim constraint would not be satisfied" in result.scheduler_message


def test_an_allocated_claim_waiting_for_binding_conditions_says_which_and_a_failed_one_says_so() -> None:
    from claims.diagnosis.binding import binding_waits

    allocated = nvidia.claim_object("team", "bound", [gpu()])
    result = {
        "request": "gpu",
        "driver": "gpu.nvidia.com",
        "pool": "a",
        "device": "gpu-0",
        "bindingConditions": ["example.com/attached"],
        "bindingFailureConditions": ["example.com/failed"],
    }
    allocated["status"] = {"allocation": {"devices": {"results": [result]}}}
    diagnosis = diagnose(state(node("a", "H100", gpus=1), allocated), allocated)
    assert diagnosis.summary == (
        "team/bound is already allocated (1 devices). Binding conditions pending: device "
        "gpu.nvidia.com/a/gpu-0 of team/bound waits for example.com/attached to be True."
    )
    condition = {"type": "example.com/failed", "status": "True"}
    device = {"driver": "gpu.nvidia.com", "pool": "a", "device": "gpu-0", "conditions": [condition]}
    allocated["status"]["devices"] = [device]
    assert binding_waits(allocated) == [
        "device gpu.nvidia.com/a/gpu-0 of team/bound reports example.com/failed: the scheduler frees the "
        "allocation and tries again"
    ]
    device["conditions"] = [{"type": "example.com/attached", "status": "True"}]
    assert binding_waits(allocated) == []


def test_odd_allocation_results_and_device_statuses_never_stop_the_binding_check() -> None:
    # Found by the what-if fuzzing (tests/unit/test_whatif_shapes.py): a null result entry.
    from claims.diagnosis.binding import binding_waits

    claim = nvidia.claim_object("team", "odd", [gpu()])
    result = {"driver": "d", "pool": "p", "device": "x", "bindingConditions": ["ready", 7]}
    claim["status"] = {
        "allocation": {"devices": {"results": [None, "text", result]}},
        "devices": [None, {"driver": "d", "pool": "p", "device": "x", "conditions": [None, {"type": "7"}]}],
    }
    assert binding_waits(claim) == ["device d/p/x of team/odd waits for ready, 7 to be True"]
    claim["status"]["devices"] = "not a list"
    result["bindingConditions"] = "ready"  # not a list: nothing to wait for
    assert binding_waits(claim) == []


def test_a_request_of_an_unknown_mode_is_shown_with_its_mode_not_a_count_of_zero() -> None:
    result = diagnose(state(node("a", "H100", gpus=1)), claim([gpu(allocation_mode="AtLeast", count=2)]))
    assert result.category == "unsupported"
    [request] = [r for r in result.requests if "groups" in r]
    assert request["count"] == "AtLeast (unsupported)"
    exact = diagnose(state(node("a", "H100", gpus=1)), claim([gpu(count=2)]))
    assert [r["count"] for r in exact.requests if "groups" in r] == [2]
