"""The read model's aggregates are kept per process while no cluster's version changed: a repeated page
reads one row per cluster, and whatever ingest commits (or rolls back) shows in the next answer."""

from __future__ import annotations

import importlib
from io import StringIO

import pytest
from django.apps import apps as django_apps
from django.core.management import call_command
from django.db import transaction

from fleet import ingest, readmodel, selectors
from fleet.models import GpuState, ReadModelVersion
from tests.fleet_pages.conftest import FIXTURE, FIXTURE_GPUS

pytestmark = pytest.mark.django_db(transaction=False)


def overview(cluster_id: int) -> readmodel.FleetSummary:
    return readmodel.summaries(readmodel.Scope((cluster_id,), gpu_devices_only=True))[cluster_id]


def tainted(summary: readmodel.FleetSummary) -> int:
    return sum(g.tainted for g in summary.groups)


def test_a_repeated_summary_reads_only_the_versions(fleet, django_assert_num_queries):
    first = overview(fleet.pk)
    assert first.groups
    with django_assert_num_queries(1):  # the versions; the aggregates come from this process
        again = overview(fleet.pk)
    assert again == first
    models = selectors.gpu_models()
    assert models
    with django_assert_num_queries(1):
        assert selectors.gpu_models() == models


def test_a_change_written_by_ingest_shows_in_the_next_summary(fleet, editor):
    before = overview(fleet.pk)
    token = ReadModelVersion.objects.get(cluster=fleet).token
    editor.taint_devices(editor.gpu_slices()[0], 2)
    assert ReadModelVersion.objects.get(cluster=fleet).token != token
    after = overview(fleet.pk)
    assert tainted(after) == tainted(before) + 2
    per_device = selectors.fleet_summary_per_device(fleet.pk)
    assert selectors.fleet_summary(fleet.pk).as_dict() == per_device.as_dict()


def test_a_rolled_back_change_leaves_the_summary_it_undid(fleet, editor):
    before = overview(fleet.pk)
    seen: list[int] = []

    def change_then_fail() -> None:
        with transaction.atomic():
            editor.taint_devices(editor.gpu_slices()[0], 3)
            seen.append(tainted(overview(fleet.pk)))  # cached under the uncommitted token
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        change_then_fail()
    assert seen == [tainted(before) + 3]
    assert overview(fleet.pk) == before


def test_a_caller_changing_its_answer_does_not_change_the_next(fleet):
    first = overview(fleet.pk)
    expected = first.as_dict()
    first.groups[0].free += 1000
    first.models.clear()
    assert overview(fleet.pk).as_dict() == expected


def test_a_deleted_cluster_leaves_the_summaries(fleet):
    assert fleet.pk in readmodel.summaries(readmodel.Scope())
    ingest.drop_cluster(fleet.name)
    assert readmodel.summaries(readmodel.Scope()) == {}
    assert selectors.gpu_models() == []


def test_the_migration_gives_every_existing_cluster_a_token(fleet):
    other = ingest.get_or_create_cluster("without-rows")
    ReadModelVersion.objects.all().delete()
    migration = importlib.import_module("fleet.migrations.0011_read_model_version")
    migration.version_every_cluster(django_apps, None)
    assert set(ReadModelVersion.objects.values_list("cluster_id", flat=True)) == {fleet.pk, other.pk}


@pytest.mark.django_db(transaction=True)
def test_a_database_older_than_the_read_model_migrates_with_its_clusters():
    """Migration fleet 0008 fills the read model with the code's own writer, before the tokens' table
    exists (0011): upgrading a database that holds a cluster from before 0008 must get through both."""
    call_command("import_snapshot", str(FIXTURE), cluster="fixtures", stdout=StringIO())
    fleet = ingest.get_or_create_cluster("fixtures")
    expected = selectors.fleet_summary_per_device(fleet.pk).as_dict()
    try:
        call_command("migrate", "fleet", "0007", verbosity=0)
    finally:
        call_command("migrate", verbosity=0)  # every app: claims' migrations after fleet 0007 were undone too
    assert GpuState.objects.filter(cluster=fleet).count() == FIXTURE_GPUS
    assert ReadModelVersion.objects.filter(cluster=fleet).exists()
    assert selectors.fleet_summary(fleet.pk).as_dict() == expected
