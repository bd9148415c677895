from django.apps import AppConfig


class ClaimsConfig(AppConfig):
    name = "claims"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registering here keeps fleet.ingest free of imports from claims (fleet never imports claims).
        from claims.ingest_specs import register_all
        from claims.tasks import on_fleet_change
        from fleet.ingest import add_change_listener

        register_all()
        # Pending claims' diagnoses are recomputed (debounced) when the fleet changes.
        add_change_listener(on_fleet_change)
