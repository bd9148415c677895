"""claims.causes: pending claims grouped by what their diagnosis says, one summary line per group.

The diagnoses come from the real engine on small simulated fleets, so the tests follow the result shape."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from claims.causes import UNDIAGNOSED, Pending, cause_of, group_causes, plain_selector
from claims.diagnosis import diagnose
from simulator import nvidia
from tests.diagnosis.fleet import CAP, GPU, claim, held, node, state

T0 = datetime(2026, 3, 6, 18, 0, tzinfo=UTC)
MEM_150 = f"{CAP}.memory.compareTo(quantity('150Gi')) >= 0"


def gpu(count: int = 1, selectors: tuple[str, ...] = (), cls: str = "gpu.nvidia.com") -> dict[str, Any]:
    return nvidia.exactly_request("gpu", cls, count, list(selectors))


def item(name: str, result: dict[str, Any] | None, minutes: int = 0, **kwargs: Any) -> Pending:
    return Pending("c1", "team", name, T0 + timedelta(minutes=minutes), result, **kwargs)


def big_fleet():
    """Two B200 held by two claims, four H100 free: >= 150Gi matches only the (held) B200."""
    return state(
        node("a", "B200", gpus=2),
        held("older", "a", ["gpu-0"], "2026-03-06T10:00:00Z"),
        held("newer", "a", ["gpu-1"], "2026-03-07T10:00:00Z"),
        node("h", "H100", gpus=4),
    )


def test_claims_wanting_the_same_held_devices_form_one_group_whatever_their_count_or_name() -> None:
    fleet = big_fleet()
    one = diagnose(fleet, claim([gpu(1, (MEM_150,))], name="x")).as_dict()
    two = diagnose(fleet, claim([gpu(2, (MEM_150,))], name="completely-different")).as_dict()
    groups = group_causes([item("b", two, 5), item("a", one, 1), item("c", one, 9)])
    assert len(groups) == 1
    (group,) = groups
    assert group.category == "capacity"
    assert group.count == 3
    assert [m.name for m in group.members] == ["a", "b", "c"]  # oldest first
    assert group.summary == "3 want memory >= 150Gi: only B200 match, all 2 held"
    assert group.examples == ["team/a", "team/b", "team/c"]
    assert group.suggestion == one["suggestions"][0]


def test_the_key_ignores_names_and_ages_but_not_the_cluster() -> None:
    result = diagnose(big_fleet(), claim([gpu(1, (MEM_150,))])).as_dict()
    a = cause_of(item("a", result, 0))
    b = cause_of(item("zzz", result, 600))
    assert a == b
    other = cause_of(Pending("c2", "team", "a", T0, result))
    assert other.key != a.key
    assert a.key.startswith("capacity-")
    assert a.parts == ("gpu.nvidia.com", "B200")


def test_different_causes_are_different_groups_largest_first() -> None:
    fleet = big_fleet()
    capacity = diagnose(fleet, claim([gpu(1, (MEM_150,))])).as_dict()
    impossible = f"{CAP}.memory.compareTo(quantity('400Gi')) >= 0"
    no_match = diagnose(fleet, claim([gpu(1, (impossible,))])).as_dict()
    broken = f"{GPU}.nvlinkDomain == 'rack-7'"
    cel = diagnose(fleet, claim([gpu(1, (broken,))])).as_dict()
    assert (capacity["category"], no_match["category"], cel["category"]) == (
        "capacity",
        "no-match",
        "cel-error",
    )
    groups = group_causes(
        [item("n", no_match, 0), item("c1", capacity, 3), item("c2", capacity, 4), item("e", cel, 1)]
    )
    assert [(g.category, g.count) for g in groups] == [("capacity", 2), ("no-match", 1), ("cel-error", 1)]
    assert groups[1].summary.startswith("1 match no device: memory >= 400Gi (nearest: memory ")
    assert groups[2].summary == f"1 fail with a CEL error: no such key nvlinkDomain in `{broken}`"


def test_cel_errors_on_different_attributes_are_separate_causes() -> None:
    fleet = big_fleet()
    a = diagnose(fleet, claim([gpu(1, (f"{GPU}.nvlinkDomain == 'x'",))])).as_dict()
    b = diagnose(fleet, claim([gpu(1, (f"{GPU}.gpuMemoryGiB >= 80",))])).as_dict()
    assert len(group_causes([item("a", a), item("b", b)])) == 2
    assert len(group_causes([item("a", a), item("b", a)])) == 1


def test_fragmentation_names_the_profile_and_the_idle_bigger_slices() -> None:
    layout = node("m", "H100", mode="static-mig", layout="balanced", gpus=1)
    small = [
        d["name"]
        for s in layout[1:]
        for d in s["spec"]["devices"]
        if d["attributes"]["profile"]["string"] == "1g.10gb"
    ]
    fleet = state(layout, held("chat", "m", small, "2026-03-06T10:00:00Z"))
    request = gpu(1, (f"{GPU}.profile == '1g.10gb'",), cls="mig.nvidia.com")
    result = diagnose(fleet, claim([request])).as_dict()
    (group,) = group_causes([item("a", result), item("b", result, 1)])
    assert group.category == "fragmentation"
    assert group.summary == "2 want H100 1g.10gb: none free, 1 2g.20gb slices, 1 3g.40gb slices idle"


def test_taint_groups_carry_the_taints() -> None:
    taint = {"key": "nvidia.com/gpu-health", "value": "xid-79", "effect": "NoSchedule"}
    fleet = state(node("a", "H100", gpus=2, taints={0: [taint], 1: [taint]}))
    result = diagnose(fleet, claim([gpu()])).as_dict()
    (group,) = group_causes([item("a", result)])
    assert group.category == "taint"
    assert "nvidia.com/gpu-health=xid-79:NoSchedule" in group.summary
    assert "nvidia.com/gpu-health=xid-79:NoSchedule" in cause_of(item("a", result)).parts


def test_not_created_pods_group_by_template() -> None:
    pod = nvidia.pod_object("team", "job", [("gpus", nvidia.from_template("missing-tpl"))])
    fleet = state(node("a", "H100", gpus=1), pod)
    result = diagnose(fleet, pod).as_dict()
    assert result["category"] == "not-created"
    groups = group_causes([item("job", result, kind="pod"), item("job2", result, 1, kind="pod")])
    assert [(g.category, g.count) for g in groups] == [("not-created", 2)]
    assert "missing-tpl" in groups[0].summary


def test_undiagnosed_items_form_their_own_group() -> None:
    (group,) = group_causes([item("a", None), item("b", None, 1)])
    assert group.category == UNDIAGNOSED
    assert group.summary == "2 not diagnosed yet"
    assert item("a", None).summary == "No diagnosis stored yet."


def test_plain_selector_reads_like_a_person() -> None:
    assert plain_selector(MEM_150) == "memory >= 150Gi"
    assert plain_selector(f"{GPU}.profile == '1g.10gb'") == "profile == '1g.10gb'"
    assert plain_selector(f"{CAP}.memory.isGreaterThan(quantity('80Gi'))") == "memory > 80Gi"


def test_claims_that_fit_now_say_why_they_still_wait() -> None:
    pod = nvidia.pod_object(
        "team",
        "job",
        [("gpus", nvidia.from_claim("want"))],
        scheduled=nvidia.unschedulable_condition(
            nvidia.fit_error_message(1, {"cannot allocate all claims": 1}), "t"
        ),
    )
    pending = nvidia.claim_object("team", "want", [gpu()])
    result = diagnose(state(node("a", "H100", gpus=1), pod, pending), pending).as_dict()
    (group,) = group_causes([item("want", result)])
    assert group.category == "fits"
    assert group.summary == (
        "1 fit now, still pending: the scheduler has not retried since the fleet changed; "
        "it will on the next fleet event"
    )
