"""The Celery app. Without REDIS_URL tasks run in-process (settings.CELERY_TASK_ALWAYS_EAGER).

Two additions to the stock worker, both about surviving a lost broker (docs/watchers.md, "Faults"):

- ``BrokerLossTolerantConsumer``: kombu's Redis channel cannot be closed once the broker connection is
  gone (restoring the unacknowledged messages asks a detached transport for its host: ``AttributeError:
  'NoneType' object has no attribute 'hostname'``). Stock Celery treats that as an unrecoverable error and
  stops the worker, which then waits for its running watch rounds (up to 10 minutes) while consuming
  nothing. This consumer finishes the cleanup without the restore and reconnects like after any other
  connection loss. Skipping the restore loses nothing: the unacknowledged messages are in Redis's own
  "unacked" hash, which Redis either lost (a restart without persistence: the beat restarts the streams)
  or still has (kombu restores it after the visibility timeout; a duplicate round exits at the lock).
- ``AliveFileStep``: the consumer's event loop touches ``CLAIMSCOPE_WORKER_ALIVE_FILE`` every
  ``ALIVE_EVERY`` seconds, so a liveness probe (``k8s/base/worker.yaml``) can tell a consuming worker from
  a live process whose consumer is dead or stuck, without a round trip through the broker.
- ``StopRoundsStep``: every way a worker stops (warm, cold, an unrecoverable error) first tells the
  running watch rounds to end; otherwise only the SIGTERM handler did, and a worker stopping for another
  reason waited for its rounds' watches to time out.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from celery import Celery, bootsteps
from celery.worker.consumer import Consumer

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

log = logging.getLogger(__name__)


class BrokerLossTolerantConsumer(Consumer):
    def on_connection_error_after_connected(self, exc: Exception) -> None:
        connection = self.connection
        channel = getattr(connection, "_default_channel", None) if connection is not None else None
        qos = getattr(channel, "_qos", None)
        if qos is not None:
            # The broker is gone: the restore cannot reach it (see the module docstring). An empty
            # delivered set marked restored is what a completed restore leaves; closing skips it.
            qos._delivered.clear()
            qos._delivered.restored = True
        if channel is not None:
            # Rounds still running hold messages of this channel; their acks (or rejects) come later,
            # from the event loop, and on a closed Redis channel raise AttributeError there, which
            # stops the worker. The broker forgot those deliveries or restores them after the
            # visibility timeout, so dropping the acknowledgement is what a lost connection means.
            channel.basic_ack = channel.basic_reject = _dropped_acknowledgement
        super().on_connection_error_after_connected(exc)


def _dropped_acknowledgement(delivery_tag: object, *args: Any, **kwargs: Any) -> None:
    log.debug("acknowledgement of %s dropped: its broker connection was lost", delivery_tag)


class StopRoundsStep(bootsteps.StartStopStep):
    """Runs before the pool stops on every shutdown path (bootsteps stop in reverse start order)."""

    requires = ("celery.worker.components:Pool",)

    def _stop_rounds(self, worker: Any) -> None:
        from fleet.tasks import watch  # here: the app module is loaded before Django apps are ready

        watch.stop_rounds()

    close = stop = shutdown = terminate = _stop_rounds


ALIVE_EVERY = 10.0


class AliveFileStep(bootsteps.StartStopStep):
    """Runs with the consumer: started after each (re)connection, stopped when the consumer stops."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        from django.conf import settings  # read when the worker starts, not when the app module loads

        self.path = (
            Path(settings.CLAIMSCOPE_WORKER_ALIVE_FILE) if settings.CLAIMSCOPE_WORKER_ALIVE_FILE else None
        )
        self.entry: Any = None
        super().__init__(consumer, **kwargs)

    def include_if(self, consumer: Any) -> bool:
        return self.path is not None

    def start(self, consumer: Any) -> None:
        self._touch()
        # The consumer's timer runs in its event loop: a dead or blocked loop stops touching the file.
        self.entry = consumer.timer.call_repeatedly(ALIVE_EVERY, self._touch)

    def stop(self, consumer: Any) -> None:
        if self.entry is not None:
            self.entry.cancel()
            self.entry = None

    shutdown = stop

    def _touch(self) -> None:
        assert self.path is not None
        try:
            self.path.touch()
        except OSError as exc:
            log.warning("cannot touch the worker's alive file %s: %s", self.path, exc)


app = Celery("claimscope")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.worker_consumer = f"{__name__}:BrokerLossTolerantConsumer"
# A round holds its message for the whole watch; a broker reconnect must not cancel it (the round's data
# path is PostgreSQL and the Kubernetes API, not the broker). Set explicitly: Celery warns about the default.
app.conf.worker_cancel_long_running_tasks_on_connection_loss = False
app.steps["worker"].add(StopRoundsStep)
app.steps["consumer"].add(AliveFileStep)
app.autodiscover_tasks()
