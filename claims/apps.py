from django.apps import AppConfig


class ClaimsConfig(AppConfig):
    name = "claims"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Hooks registered here keep fleet free of imports from claims (fleet never imports claims).
        from claims import history
        from claims.tasks import on_fleet_change
        from fleet.access.kube_rbac import add_namespace_source
        from fleet.ingest import add_change_listener, set_claim_hooks

        # Every state change of a claim, recorded in the batch's transaction.
        set_claim_hooks(history.record_written, history.record_deleted)
        # Deleted claims' namespaces stay in their history: RBAC is asked about them too.
        add_namespace_source(history.namespaces_of)
        # Pending claims' diagnoses are recomputed (debounced) when the fleet changes.
        add_change_listener(on_fleet_change)
