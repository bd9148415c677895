"""An initial sync leaves the planner's statistics of the tables it filled current.

Until autovacuum analyzes a bulk load, PostgreSQL plans as if the tables were nearly empty: on the L fleet
the heatmap's read of ten changed pools took 251 s instead of 0.01 s, and the live feed stalled for the
first minute of a new deployment.
"""

from django.db import connection

from fleet import ingest
from fleet.models import Device, ResourceSlice
from tests.db.test_ingest import slice_record


def estimated_rows(table: str) -> float:
    with connection.cursor() as cur:
        cur.execute("SELECT reltuples FROM pg_class WHERE relname = %s", [table])
        return float(cur.fetchone()[0])


def analyze_now(*tables: str) -> None:
    with connection.cursor() as cur:
        cur.execute(f"ANALYZE {', '.join(tables)}")


def test_an_initial_sync_analyzes_the_tables_it_filled():
    analyze_now("fleet_resourceslice", "fleet_device")  # the planner's view: empty tables
    assert estimated_rows("fleet_device") == 0
    cluster = ingest.get_or_create_cluster("stats")
    records = [slice_record(f"node-{i}", 10 + i, gpus=8) for i in range(20)]
    result = ingest.replace_all(cluster, "ResourceSlice", records, 100)
    assert len(result.written) == 20
    assert estimated_rows("fleet_resourceslice") == ResourceSlice.objects.count() == 20
    assert estimated_rows("fleet_device") == Device.objects.count() == 160


def test_a_relist_over_stored_rows_leaves_analyzing_to_autovacuum():
    # Only the initial sync (a bulk load into nothing) pays for ANALYZE; later relists change a few rows.
    cluster = ingest.get_or_create_cluster("stats")
    ingest.replace_all(cluster, "ResourceSlice", [slice_record("node-0", 10, gpus=8)], 100)
    analyze_now("fleet_device")
    records = [slice_record(f"node-{i}", 10 + i, gpus=8) for i in range(20)]
    ingest.replace_all(cluster, "ResourceSlice", records, 200)
    assert Device.objects.count() == 160 and estimated_rows("fleet_device") == 8


def test_a_large_batch_analyzes_the_tables_it_grew_and_the_read_model():
    # An import or a fleet built by batches is a bulk load too: the planner must not plan it as empty.
    analyze_now("fleet_resourceslice", "fleet_device", "fleet_gpustate")
    cluster = ingest.get_or_create_cluster("stats")
    records = [slice_record(f"node-{i}", 10 + i, gpus=1) for i in range(600)]
    ingest.apply_batch(cluster, "ResourceSlice", [ingest.Change("upsert", r) for r in records])
    assert estimated_rows("fleet_resourceslice") == 600
    assert estimated_rows("fleet_device") == Device.objects.count() == 600
    assert estimated_rows("fleet_gpustate") == 600


def test_a_small_watch_batch_leaves_analyzing_to_autovacuum():
    cluster = ingest.get_or_create_cluster("stats")
    records = [slice_record(f"node-{i}", 10 + i, gpus=1) for i in range(600)]
    ingest.apply_batch(cluster, "ResourceSlice", [ingest.Change("upsert", r) for r in records])
    more = [slice_record(f"more-{i}", 1000 + i, gpus=1) for i in range(10)]
    ingest.apply_batch(cluster, "ResourceSlice", [ingest.Change("upsert", r) for r in more])
    assert Device.objects.count() == 610 and estimated_rows("fleet_device") == 600
