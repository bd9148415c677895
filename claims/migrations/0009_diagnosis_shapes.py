# A diagnosis is stored once per claim shape (DiagnosisShape) and each pending claim's row points to it.
# The stored diagnoses are derived data: they are dropped here and the diagnosis worker's first run after
# the upgrade (a full recompute: its process has no fleet yet) stores them again. Kept pending causes
# (PendingCause, the triage's history) are not touched.
#
# The rows are dropped after the old columns: on PostgreSQL dropping a column holds the table's exclusive
# lock to the end of the migration, so a worker of the previous release still writing cannot add a row
# that the new non-null column would refuse. Reversed, the rows are dropped before the old non-null
# columns come back.

import django.db.models.deletion
from django.db import migrations, models


def drop_diagnoses(apps, schema_editor):
    apps.get_model("claims", "ClaimDiagnosis").objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("claims", "0008_diagnosis_group_key"),
    ]

    operations = [
        migrations.CreateModel(
            name="DiagnosisShape",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(max_length=64)),
                ("named", models.BooleanField(default=False)),
                ("category", models.CharField(db_index=True, max_length=32)),
                ("summary", models.TextField()),
                ("result", models.JSONField(default=dict)),
                ("group_key", models.CharField(blank=True, default="", max_length=64)),
                ("computed_at", models.DateTimeField()),
                ("cluster", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="fleet.cluster")),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("cluster", "key"), name="diagnosis_shape_key")],
            },
        ),
        migrations.RemoveField(model_name="claimdiagnosis", name="category"),
        migrations.RemoveField(model_name="claimdiagnosis", name="summary"),
        migrations.RemoveField(model_name="claimdiagnosis", name="result"),
        migrations.RemoveField(model_name="claimdiagnosis", name="group_key"),
        migrations.RemoveField(model_name="claimdiagnosis", name="computed_at"),
        migrations.RunPython(drop_diagnoses, drop_diagnoses),
        migrations.AddField(
            model_name="claimdiagnosis",
            name="pod_name",
            field=models.CharField(blank=True, default="", max_length=253),
        ),
        migrations.AddField(
            model_name="claimdiagnosis",
            name="shape",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, to="claims.diagnosisshape", default=None
            ),
            preserve_default=False,
        ),
    ]
