from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created


class FleetConfig(AppConfig):
    name = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import fleet.ingest  # noqa: F401  (registers every kind's table spec)

        connection_created.connect(_json_as_text, dispatch_uid="fleet.json_as_text")


def _json_as_text(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``json`` columns (``fleet.models.TextJSONField``) reach Django as text, as Django has psycopg send
    ``jsonb`` (its ``get_adapters_template``): the field decodes them itself, and psycopg's own loader
    would decode them first with the standard library's slower parser."""
    if connection.vendor == "postgresql":
        from psycopg.types.string import TextLoader

        connection.connection.adapters.register_loader("json", TextLoader)
