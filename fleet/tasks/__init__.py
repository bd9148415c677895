"""fleet's Celery tasks: the watch streams (``watch``, on the "watch" queue), the allocation history
(``history``, beat) and the API summary (``summary``). Imported here so that Celery's autodiscovery of
``fleet.tasks`` registers every one of them."""

from fleet.tasks import history, watch

__all__ = ["history", "watch"]
