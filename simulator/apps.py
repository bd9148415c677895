from django.apps import AppConfig


class SimulatorConfig(AppConfig):
    """The simulated fleet, its API-server and dcgm-exporter stand-ins, the demo and the replay. Installed for
    its commands (``demo``, ``simulate``, ``demo_login``); production code never imports it."""

    name = "simulator"
    default_auto_field = "django.db.models.BigAutoField"
