"""A list page costs the same number of queries whatever the number of rows it holds."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.api.test_endpoints import LISTS


def page(api, name):
    with CaptureQueriesContext(connection) as queries:
        response = api.get(f"/api/v1/{name}/", {"page_size": 10_000})
    assert response.status_code == 200
    return len(response.json()["results"]), len(queries)


def grow(rounds):
    """Fleet data for the endpoints: the fixture fleet, then the simulated one on top, plus history."""
    from fleet.tasks.history import sample_allocation

    sample_allocation(f"2026-12-01T10:{rounds:02d}:00+00:00")


@pytest.mark.parametrize("name", [*LISTS])
def test_list_endpoints_run_a_constant_number_of_queries(api, name, fixture_fleet, request):
    grow(1)
    small_rows, small_queries = page(api, name)
    request.getfixturevalue("sim_fleet")
    for minute in range(2, 12):
        grow(minute)
    large_rows, large_queries = page(api, name)
    assert large_rows > small_rows, name
    assert large_queries == small_queries, name


@pytest.mark.parametrize("name", ["summary", "heatmap"])
def test_aggregate_endpoints_run_a_constant_number_of_queries(api, name, fixture_fleet, request):
    # Each capture follows one request that takes in what changed before it: the heatmap's feed applies
    # the change events of the import first (delivered in process by the embedded channel layer), a cost
    # per change, not per request. What is compared is a request on a settled fleet, small then large.
    api.get(f"/api/v1/{name}/")
    with CaptureQueriesContext(connection) as small:
        assert api.get(f"/api/v1/{name}/").status_code == 200
    request.getfixturevalue("sim_fleet")
    api.get(f"/api/v1/{name}/")
    with CaptureQueriesContext(connection) as large:
        assert api.get(f"/api/v1/{name}/").status_code == 200
    assert len(large) == len(small)
