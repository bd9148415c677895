import secrets

import django.db.models.deletion
from django.db import migrations, models


def version_every_cluster(apps, schema_editor):
    """Clusters whose rows were written before the table existed get a token too: without one, the
    deletion of such a cluster would not change the caches' key (fleet.readmodel)."""
    Cluster = apps.get_model("fleet", "Cluster")
    ReadModelVersion = apps.get_model("fleet", "ReadModelVersion")
    ReadModelVersion.objects.bulk_create(
        [ReadModelVersion(cluster_id=pk, token=secrets.randbits(62)) for pk in Cluster.objects.values_list("pk", flat=True)]
    )


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0010_device_taint_rules"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReadModelVersion",
            fields=[
                (
                    "cluster",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        serialize=False,
                        to="fleet.cluster",
                    ),
                ),
                ("token", models.BigIntegerField()),
            ],
        ),
        migrations.RunPython(version_every_cluster, migrations.RunPython.noop),
    ]
