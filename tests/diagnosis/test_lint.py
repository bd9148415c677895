"""Lint findings on claims, templates and classes (no allocation)."""

from __future__ import annotations

from claims.lint import Finding, lint_object
from simulator import nvidia
from tests.diagnosis.fleet import CAP, GPU, node, state

FLEET = state(node("a", "H100", gpus=1), node("m", "H100", mode="static-mig", layout="balanced", gpus=1))


def lint(selectors: list[str], cls: str = "gpu.nvidia.com", **kwargs: object) -> list[Finding]:
    request = nvidia.exactly_request("gpu", cls, 1, selectors)
    return lint_object(nvidia.claim_template("team", "t", [request], **kwargs), FLEET)  # type: ignore[arg-type]


def codes(findings: list[Finding]) -> list[str]:
    return [f.code for f in findings]


def test_ordering_on_a_quantity_is_a_compile_error_with_the_compare_to_fix() -> None:
    [finding] = lint([f"{CAP}.memory >= quantity('40Gi')"])
    assert finding.code == "cel-compile"
    assert "'_>=_' applied to '(kubernetes.Quantity, kubernetes.Quantity)'" in finding.message
    assert "compareTo(quantity('40Gi')) >= 0" in finding.suggestion


def test_memory_read_as_an_attribute_is_flagged_as_a_capacity() -> None:
    [finding] = lint([f"{GPU}.memory >= quantity('40Gi')"])
    assert finding.code == "cel-compile"
    assert "Memory is a capacity" in finding.suggestion
    [finding] = lint([f"{GPU}.memory.compareTo(quantity('40Gi')) >= 0"])
    assert finding.code == "wrong-map"
    assert finding.suggestion.startswith("Use device.capacity['gpu.nvidia.com'].memory")


def test_ordering_on_a_version_attribute_is_flagged() -> None:
    findings = lint([f"{GPU}.driverVersion > '550'"])
    assert codes(findings) == ["version-ordering"]
    assert "semver" in findings[0].suggestion


def test_an_attribute_nobody_publishes_suggests_the_nearest_name() -> None:
    [finding] = lint([f"{GPU}.productname == 'NVIDIA H100 80GB HBM3'"])
    assert finding.code == "unknown-attribute"
    assert finding.suggestion == "Did you mean 'productName'?"


def test_an_in_list_selector_suggests_first_available() -> None:
    [finding] = lint([f"{GPU}.profile in ['2g.20gb', '1g.10gb']"], cls="mig.nvidia.com")
    assert finding.code == "in-list-order"
    assert "firstAvailable" in finding.suggestion


def test_unqualified_constraint_attributes_are_flagged() -> None:
    findings = lint([], constraints=[{"matchAttribute": "productName"}])
    assert codes(findings) == ["unqualified-constraint"]
    assert "gpu.nvidia.com/productName" in findings[0].suggestion


def test_pcie_root_constraint_is_explained() -> None:
    findings = lint([], constraints=[{"matchAttribute": "resource.kubernetes.io/pcieRoot"}])
    assert codes(findings) == ["pcie-root"]


def test_counts_over_32_are_flagged_per_request_and_per_claim() -> None:
    big = nvidia.exactly_request("a", "gpu.nvidia.com", 40)
    two = [
        nvidia.exactly_request("a", "gpu.nvidia.com", 20),
        nvidia.exactly_request("b", "gpu.nvidia.com", 20),
    ]
    assert codes(lint_object(nvidia.claim_object("team", "c", [big]))) == ["too-many"]
    findings = lint_object(nvidia.claim_object("team", "c", two))
    assert [(f.code, f.where) for f in findings] == [("too-many", "claim")]


def test_a_clean_claim_has_no_findings() -> None:
    assert lint([f"{CAP}.memory.compareTo(quantity('40Gi')) >= 0"]) == []


def test_device_class_selectors_are_linted() -> None:
    cls = nvidia.device_classes()[0]
    cls["spec"]["selectors"].append(
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].typo == 'x'"}}
    )
    findings = lint_object(cls, FLEET)
    assert [(f.code, f.where) for f in findings] == [("unknown-attribute", "selector #1")]


def test_a_selector_without_cel_is_an_unsupported_selector_in_the_allocators_words() -> None:
    request = nvidia.exactly_request("gpu", "gpu.nvidia.com", 1, [])
    request["exactly"]["selectors"] = [{"future": {"expression": "x"}}]
    [finding] = lint_object(nvidia.claim_template("team", "t", [request]), FLEET)
    assert (finding.code, finding.severity) == ("selector-unsupported", "error")
    assert (finding.where, finding.message) == (
        "gpu selector #0",
        "CEL expression empty (unsupported selector type?)",
    )
