"""The read model's revision (what the live feed polls) and the columns of the API's GPU rows, then the read
model filled from what is stored.

The fill runs here, not where the tables are created (0007), because it writes rows with the code's own
rules and columns (fleet.ingest.gpu_state, the only writer), which include the revision."""

from django.db import migrations, models


def fill(apps, schema_editor):
    """Recompute the read model from the devices and allocations already stored, by the code's own rules
    (the rules are the code's, not a historical model's)."""
    from fleet.ingest import gpu_state, statistics

    cluster = apps.get_model("fleet", "Cluster")
    # A database just restored has no planner statistics: the rebuild's joins need them.
    sources = [apps.get_model(*name.split(".")) for name in (
        "fleet.ResourceSlice", "fleet.Device", "fleet.ResourceClaim", "fleet.DeviceAllocation"
    )]  # fmt: skip
    statistics.analyze(sources)
    gpu_state.rebuild_all(cluster.objects.values_list("pk", flat=True))
    statistics.analyze(gpu_state.READ_MODEL)


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0007_gpu_state"),
    ]

    operations = [
        migrations.AddField(
            model_name="gpustate",
            name="revision",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="gpustate",
            name="product_name",
            field=models.CharField(blank=True, max_length=128),
        ),
        migrations.AddField(
            model_name="gpustate",
            name="mig_devices",
            field=models.IntegerField(default=0),
        ),
        migrations.AddField(
            model_name="gpustate",
            name="tainted_devices",
            field=models.IntegerField(default=0),
        ),
        migrations.AddIndex(
            model_name="gpustate",
            index=models.Index(fields=["cluster", "revision"], name="gpustate_revision"),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
