"""``?format=csv`` on every list endpoint parses, and holds the same rows and values as the JSON page."""

from __future__ import annotations

import csv
import io
import json

import pytest

from tests.api.test_endpoints import LISTS


def flatten(row: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def same(csv_value: str, json_value) -> bool:
    if json_value is None:
        return csv_value == ""
    if isinstance(json_value, bool):
        return csv_value == ("true" if json_value else "false")
    if isinstance(json_value, list):
        return json.loads(csv_value) == json_value
    if isinstance(json_value, int | float):
        return float(csv_value) == float(json_value)
    return csv_value == json_value


@pytest.fixture
def everything(fixture_fleet, sim_fleet):
    from claims.tasks import recompute_diagnoses
    from fleet.tasks.history import sample_allocation

    recompute_diagnoses("fixtures")
    sample_allocation()


@pytest.mark.usefixtures("everything")
@pytest.mark.parametrize("name", LISTS)
def test_csv_page_matches_the_json_page(api, name):
    params = {"page_size": 50}
    page = api.get(f"/api/v1/{name}/", params)
    assert page.status_code == 200
    rows = [flatten(r) for r in page.json()["results"]]
    response = api.get(f"/api/v1/{name}/", {**params, "format": "csv"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    parsed = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert rows, name
    assert len(parsed) == len(rows)
    for json_row, csv_row in zip(rows, parsed, strict=True):
        assert set(csv_row) >= set(json_row)
        for key, value in json_row.items():
            assert same(csv_row[key], value), (name, key, csv_row[key], value)


@pytest.mark.usefixtures("fixture_fleet")
def test_csv_next_page_is_in_the_link_header_and_errors_stay_readable(api):
    response = api.get("/api/v1/devices/", {"page_size": 5, "format": "csv"})
    assert len(list(csv.DictReader(io.StringIO(response.content.decode())))) == 5
    assert "cursor=" in response["Link"] and 'rel="next"' in response["Link"]
    bad = api.get("/api/v1/devices/", {"kind": "fpga", "format": "csv"})
    assert bad.status_code == 400 and b"kind" in bad.content
