from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import fleet.ingest  # registers every kind's table spec
        from fleet.tasks.summary import on_fleet_change

        # The API's fleet summary is recomputed (debounced, by Celery) after fleet changes.
        fleet.ingest.add_change_listener(on_fleet_change)
