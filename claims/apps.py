from django.apps import AppConfig


class ClaimsConfig(AppConfig):
    name = "claims"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registering here keeps fleet.ingest free of imports from claims (fleet never imports claims).
        from claims.ingest_specs import register_all

        register_all()
