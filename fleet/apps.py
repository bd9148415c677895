from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import fleet.ingest  # registers the cluster-scoped kinds' table specs
        from fleet import namespaced_kinds
        from fleet.tasks.summary import on_fleet_change

        namespaced_kinds.register_all()
        # The API's fleet summary is recomputed (debounced, by Celery) after fleet changes.
        fleet.ingest.add_change_listener(on_fleet_change)
