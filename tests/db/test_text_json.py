"""The large JSON columns nothing queries inside are PostgreSQL ``json`` (fleet.models.TextJSONField): kept
as the text written, read back as the same text, and decoded to the same values through Django."""

import pytest
from django.db import connection
from django.db.models import TextField
from django.db.models.functions import Cast

from fleet import ingest
from fleet.ingest import Change
from fleet.ingest.sql import json_text
from fleet.models import Device, KubeObject, ResourceSlice, TextJSONField
from fleet.normalize import normalize
from simulator import nvidia


@pytest.fixture
def cluster():
    return ingest.get_or_create_cluster("test")


def _column_type(table: str, column: str) -> str:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_name = %s AND column_name = %s",
            [table, column],
        )
        return str(cur.fetchone()[0])


def test_raw_and_device_json_are_json_columns():
    from django.apps import apps

    mirrored = [m for m in apps.get_models() if issubclass(m, KubeObject)]
    assert len(mirrored) >= 8
    for model in mirrored:
        assert _column_type(model._meta.db_table, "raw") == "json", model.__name__
        assert _column_type(model._meta.db_table, "labels") == "jsonb", model.__name__  # queried by key
    for column in ("attributes", "capacity"):
        assert isinstance(Device._meta.get_field(column), TextJSONField)
        assert _column_type("fleet_device", column) == "json"


def _slice(rv: int, extra: dict) -> dict:
    (obj,) = nvidia.node_slices("n1", "B200", mode="full", gpus=2, generation=1)
    obj["metadata"]["resourceVersion"] = str(rv)
    obj["metadata"]["annotations"] = extra
    return obj


@pytest.mark.parametrize("path", ["statements", "copy"])
def test_values_come_back_as_written(cluster, path):
    """A 100-bit integer, non-ASCII text and key order survive both writers (INSERT statements for a
    watch batch, COPY for an initial list); the stored text is the one json_text wrote, key order and all
    (``jsonb`` would have reordered the keys and added spaces)."""
    extra = {"zeta": "Grafikkarte ✓", "alpha": "1", "big": str(2**100)}
    obj = _slice(5, extra)
    obj["spec"]["devices"][0]["attributes"]["huge"] = {"int": 2**100}
    record = normalize("ResourceSlice", obj)
    if path == "copy":
        ingest.replace_all(cluster, "ResourceSlice", [record], 5)
    else:
        ingest.apply_batch(cluster, "ResourceSlice", [Change("upsert", record)])
    row = ResourceSlice.objects.get(cluster=cluster)
    assert row.raw["metadata"]["annotations"] == extra
    text = ResourceSlice.objects.annotate(t=Cast("raw", TextField())).values_list("t", flat=True).get()
    assert text == json_text(record.meta.raw)
    assert list(row.raw["metadata"]["annotations"]) == ["zeta", "alpha", "big"]
    device = Device.objects.get(cluster=cluster, name=obj["spec"]["devices"][0]["name"])
    assert device.attributes["huge"] == 2**100  # a device row keeps the value, not its type
    assert isinstance(device.capacity, dict) and device.capacity


def test_an_orm_update_writes_json(cluster):
    record = normalize("ResourceSlice", _slice(7, {}))
    ingest.apply_batch(cluster, "ResourceSlice", [Change("upsert", record)])
    ResourceSlice.objects.filter(cluster=cluster).update(
        raw={"kind": "ResourceSlice", "b": [1, 2], "a": None}
    )
    assert ResourceSlice.objects.get(cluster=cluster).raw == {"kind": "ResourceSlice", "b": [1, 2], "a": None}


@pytest.mark.parametrize("path", ["statements", "copy"])
def test_an_annotation_holding_nul_is_stored(cluster, path):
    """JSON may escape NUL (``\\u0000``), which ``jsonb`` refuses ("cannot be converted to text"): with
    ``raw`` in ``jsonb`` such an annotation failed its whole batch. ``json`` keeps the text."""
    obj = _slice(9, {"note": "before\x00after"})
    record = normalize("ResourceSlice", obj)
    if path == "copy":
        ingest.replace_all(cluster, "ResourceSlice", [record], 9)
    else:
        ingest.apply_batch(cluster, "ResourceSlice", [Change("upsert", record)])
    assert ResourceSlice.objects.get(cluster=cluster).raw["metadata"]["annotations"] == {
        "note": "before\x00after"
    }
