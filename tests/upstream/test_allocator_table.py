"""claimscope's allocator replay against upstream's own allocator test table, entry by entry.

Each test id is the upstream entry's name in allocatortesting.TestAllocator (Kubernetes v1.37.2). Entries
the engine cannot apply are skipped, and known disagreements are strict xfails, both with their reason; the
suite's summary line counts them separately from passes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from claims.allocator import allocate
from tests.upstream.allocator_table import KNOWN_DIFFERENCES, SKIPPED, Case, load, normalize

SOURCE, CASES = load()


def _params() -> list[Any]:
    params = []
    for case in CASES:
        marks: list[pytest.MarkDecorator] = []
        reason = case.skip_reason()
        if reason:
            marks.append(pytest.mark.skip(reason=f"upstream {case.name}: {reason}"))
        elif case.name in KNOWN_DIFFERENCES:
            marks.append(pytest.mark.xfail(reason=KNOWN_DIFFERENCES[case.name], strict=True))
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


def test_the_table_is_upstreams_whole_table() -> None:
    assert SOURCE == "k8s.io/dynamic-resource-allocation@v0.37.2"
    assert len(CASES) == 275
    assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", _params())
def test_the_engine_allocates_like_upstream(case: Case) -> None:
    result = allocate(case.claims(), case.node, case.snapshot(), features=case.engine_features())
    if case.expected_error is not None:
        assert (result.kind, result.message) == case.expected_error
        return
    expected = case.expected_results()
    if not case.claims():
        assert (result.ok, result.allocations) == (True, {})
        return
    if not expected:
        assert (result.ok, result.kind) == (False, "unschedulable"), result.message
        return
    assert result.ok, f"{result.kind}: {result.message}"
    got = [normalize(allocation) for allocation in result.allocations.values()]
    assert got == expected


def test_every_skip_and_known_difference_is_listed_in_findings() -> None:
    findings = (Path(__file__).parents[1] / "controlplane" / "FINDINGS.md").read_text()
    missing = [name for name in [*SKIPPED, *KNOWN_DIFFERENCES] if f"`{name}`" not in findings]
    assert missing == []
