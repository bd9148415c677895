"""Existing plain API tokens (DRF's ``authtoken_token`` table) become hashed ``ApiToken`` rows, so scripts
keep working; they expire 90 days after this migration. The plain keys are then deleted.

Raw SQL: the ``authtoken`` app is no longer installed, so its model is not available here; the table may
also not exist (a database created after the switch).
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

from django.db import migrations
from django.utils import timezone

TABLE = "authtoken_token"


def hash_plain_tokens(apps, schema_editor):
    connection = schema_editor.connection
    if TABLE not in connection.introspection.table_names():
        return
    ApiToken = apps.get_model("fleet", "ApiToken")
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, user_id, created FROM {TABLE}")
        rows = cursor.fetchall()
    for key, user_id, created in rows:
        ApiToken.objects.update_or_create(
            user_id=user_id,
            defaults={
                "digest": hashlib.sha256(key.encode()).hexdigest(),
                "prefix": key[:8],
                "created_at": created or now,
                "expires_at": now + timedelta(days=90),
            },
        )
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {TABLE}")


class Migration(migrations.Migration):
    dependencies = [("fleet", "0003_api_token_audit")]

    operations = [migrations.RunPython(hash_plain_tokens, migrations.RunPython.noop)]
