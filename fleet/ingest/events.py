"""Change publishing: one event per committed batch to the channel-layer group and to the listeners."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import transaction

from fleet import outage_log
from fleet.ingest.specs import BatchResult
from fleet.models import Cluster

log = logging.getLogger(__name__)

RELIST_KEYS = 2000  # a relist that wrote and deleted at most this many objects names them in its event


def change_event(cluster: Cluster, result: BatchResult) -> dict[str, Any]:
    """The event a committed batch publishes. Every event has "type", "cluster" and "kind" (all that the
    feed and the diagnosis trigger read). A watch batch names the keys it wrote and deleted ("written",
    "deleted": "name" or "namespace/name") and, when known, the pools whose devices or allocations it may
    have changed ("pools": [driver, pool] pairs, old and new; the heatmap re-reads only those); a relist
    says ``"resync": True`` with counts ("written_count", "deleted_count"), and names its keys as a watch
    batch does only when they are at most ``RELIST_KEYS``: listing tens of thousands of keys (an initial
    sync) cost seconds to build and send, while a relist after a watch restart writes the few objects that
    changed meanwhile, and a reader given its keys (the diagnosis) need not reread the whole kind."""
    event: dict[str, Any] = {"type": "fleet.change", "cluster": cluster.name, "kind": result.kind}
    if result.resync:
        event.update(resync=True, written_count=len(result.written), deleted_count=len(result.deleted))
    if not result.resync or len(result.written) + len(result.deleted) <= RELIST_KEYS:
        event["written"] = ["/".join(k) for k in result.written]
        event["deleted"] = ["/".join(k) for k in result.deleted]
    if not result.resync and result.pools is not None:
        event["pools"] = [list(p) for p in sorted(result.pools)]
    return event


ChangeListener = Callable[[dict[str, Any]], object]
_listeners: list[ChangeListener] = []


def add_change_listener(listener: ChangeListener) -> None:
    """Call ``listener(event)`` after each committed batch (claims registers its diagnosis trigger here,
    so fleet does not import claims)."""
    if listener not in _listeners:
        _listeners.append(listener)


def publish_on_commit(cluster: Cluster, result: BatchResult) -> None:
    if not result.changed:
        return
    event = change_event(cluster, result)
    transaction.on_commit(lambda: _notify(event))


def _notify(event: dict[str, Any]) -> None:
    publish(event)
    for listener in _listeners:
        try:
            listener(event)
        except Exception as exc:  # a listener's failure must not undo or block ingestion
            name = getattr(listener, "__qualname__", repr(listener))
            outage_log.log_failure(
                log, f"change listener {name} failed for {event['cluster']} {event['kind']}", exc
            )


def notify_imported(cluster: Cluster) -> None:
    """Tell the listeners that a whole import of ``cluster`` is written (``"imported": True``): what they
    derive from the fleet (diagnoses) is due now, not debounced, since the batches' own events may have
    been absorbed by a window that opened with the first of them."""
    _notify({"type": "fleet.change", "cluster": cluster.name, "kind": "", "imported": True})


def publish(event: dict[str, Any]) -> None:
    """Send a change event to the channel-layer group; a failure is logged, never raised into ingest."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    try:
        if loop is not None:
            # Called from code running inside an event loop's thread: schedule, don't block the loop.
            task = loop.create_task(layer.group_send(settings.CLAIMSCOPE_INGEST_GROUP, event))
            _pending.add(task)
            task.add_done_callback(_pending.discard)
        else:
            async_to_sync(layer.group_send)(settings.CLAIMSCOPE_INGEST_GROUP, event)
    except Exception as exc:  # the database is the truth; a lost notification only delays a page update
        outage_log.log_failure(
            log, f"could not publish change events for {event['cluster']} {event['kind']}", exc
        )


_pending: set[asyncio.Task[None]] = set()  # keeps scheduled sends alive until done
