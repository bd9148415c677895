from django.apps import AppConfig


class UsageConfig(AppConfig):
    """Utilization: DCGM samples from Prometheus joined to the fleet's devices, idle allocations, trends."""

    name = "usage"
    default_auto_field = "django.db.models.BigAutoField"
