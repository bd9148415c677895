"""One stream per (cluster, kind): list, then watch, feeding ingest in batches.

The reflector is independent of where objects come from (see :mod:`fleet.kube.source`). Events are read by
a small reader thread into a queue so that a batch is flushed after ``batch_size`` events or
``flush_interval`` seconds, whichever comes first, even while the source blocks waiting for more; the cursor
(last resourceVersion) is saved in the same transaction as each batch. The interval runs from when the
reader received the batch's first event: events that queued while the previous batch was applied have
waited already, so they are applied as soon as the queue is drained. Faults:

- 410 Gone: relist and replace (objects missing from the list are deleted);
- other source errors: exponential backoff with jitter, from ``backoff_min`` to ``backoff_max`` seconds;
- no event and no bookmark for ``idle_timeout`` seconds: reconnect;
- 401/403: the stream's state becomes "forbidden" with the server's message, retried slowly;
- a malformed object: logged with its name and skipped.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, close_old_connections, connection

from fleet import ingest
from fleet.gcpause import cyclic_gc_paused
from fleet.importer import ImportReport, normalize_many
from fleet.kube.source import Forbidden, Gone, Obj, Source, SourceError, list_pages, status_error
from fleet.models import Cluster, WatchCursor
from fleet.normalize import NormalizeError, is_stored, normalize, parse_resource_version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamConfig:
    batch_size: int = 500
    flush_interval: float = 0.25
    watch_timeout: float = 300.0  # the server ends a watch after this; we then resume from the cursor
    idle_timeout: float = 70.0
    backoff_min: float = 1.0
    backoff_max: float = 30.0
    forbidden_retry: float = 300.0
    lease: float = 30.0  # how long a write of this stream vouches for it (WatchCursor.lease_until)


_END = object()  # the reader's "stream ended" marker


class Reflector:
    """Mirrors one kind of one cluster into the database through ingest."""

    def __init__(
        self,
        cluster: Cluster,
        kind: str,
        source: Source,
        config: StreamConfig | None = None,
        sleep: Callable[[float], Any] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.kind = kind
        self.source = source
        self.config = config or StreamConfig()
        self.sleep = sleep
        self.clock = clock  # of the batching window and the idle timeout (tests move it)
        self.events_applied = 0

    # ----------------------------------------------------------------------------------------- cursor

    def stored_resource_version(self) -> int | None:
        cursor = WatchCursor.objects.filter(cluster=self.cluster, kind=self.kind).first()
        if cursor is None or cursor.state in ("idle", "listing") or not cursor.resource_version:
            return None
        return int(cursor.resource_version)

    def set_state(self, state: str, error: str = "") -> None:
        ingest.cursors.save_state(self.cluster, self.kind, state, error, self.config.lease)

    # ----------------------------------------------------------------------------------------- list

    def relist(self) -> int:
        """List everything and replace the stored set; returns the list's resourceVersion."""
        self.set_state("listing")
        list_rv, pages = list_pages(self.source, self.kind)
        rv = parse_resource_version(list_rv, f"{self.kind} list")
        stored = ingest_list(self.cluster, self.kind, pages, rv)
        log.info("%s/%s: listed %d objects at %d", self.cluster.name, self.kind, stored, rv)
        return rv

    def _settle_read_model(self) -> None:
        """After a failed round, once its state no longer says "listing": another kind's first list may
        have left the cluster's read model to this stream's list (``gpu_state.after_first_list``);
        recompute it now rather than after a list that may never succeed (a forbidden kind). Settled
        while the state still said "listing", a first list committing between the two would leave the
        debt to this stream again. A database error is logged, not raised."""
        try:
            if ingest.gpu_state.settle(self.cluster.pk):
                log.info(
                    "%s/%s: round failed; recomputed the read model it was owed", self.cluster.name, self.kind
                )
        except DatabaseError as exc:  # the list's error says more; the next list or batch pays the debt
            log.warning("%s/%s: cannot recompute the owed read model: %s", self.cluster.name, self.kind, exc)
            close_old_connections()

    # ----------------------------------------------------------------------------------------- watch

    def watch(self, resource_version: int, stop: threading.Event) -> int:
        """Apply watch events from ``resource_version`` until the watch ends; returns the last version.

        Raises Gone / Forbidden / SourceError from the source, and SourceError when idle too long.
        """
        events: queue.Queue[Any] = queue.Queue(maxsize=self.config.batch_size * 4)
        reader = threading.Thread(
            target=self._read,
            args=(
                self.source.watch(self.kind, str(resource_version), self.config.watch_timeout),
                events,
                stop,
            ),
            name=f"watch-{self.cluster.name}-{self.kind}",
            daemon=True,
        )
        reader.start()
        self.set_state("watching")
        last_rv = resource_version
        pending: list[ingest.Change] = []
        pending_rv = resource_version
        last_seen = self.clock()
        flush_at: float | None = None
        # On an early exit the reader thread may still block in the source until the server ends the
        # watch (at most watch_timeout); it is a daemon holding no database connection.
        while not stop.is_set():
            timeout = self.config.idle_timeout if flush_at is None else max(0.0, flush_at - self.clock())
            try:
                item = events.get(timeout=min(timeout, 1.0))
            except queue.Empty:
                item = None
            now = self.clock()
            if item is None:
                if flush_at is not None and now >= flush_at:
                    last_rv = self._flush(pending, pending_rv)
                    pending, flush_at = [], None
                if now - last_seen > self.config.idle_timeout:
                    raise SourceError(f"no event or bookmark for {self.config.idle_timeout:.0f}s")
                continue
            if item is _END:
                break
            try:
                if isinstance(item, BaseException):
                    raise item
                arrived, event = item
                change, rv = self._change(event)
            except BaseException:
                # Keep what arrived before the fault: those events are valid and the cursor follows them.
                if pending:
                    self._flush(pending, pending_rv)
                raise
            last_seen = now
            if rv is not None:
                pending_rv = max(pending_rv, rv)
            if change is not None:
                pending.append(change)
            if flush_at is None:
                flush_at = arrived + self.config.flush_interval
            if len(pending) >= self.config.batch_size:
                last_rv = self._flush(pending, pending_rv)
                pending, flush_at = [], None
        if pending or pending_rv > last_rv:
            last_rv = self._flush(pending, pending_rv)
        return last_rv

    def _read(self, iterator: Iterator[Obj], events: queue.Queue[Any], stop: threading.Event) -> None:
        try:
            for event in iterator:
                if stop.is_set():
                    break
                events.put((self.clock(), event))
        except BaseException as exc:  # handed to the applying thread, which decides what it means
            events.put(exc)
        else:
            events.put(_END)
        finally:
            close = getattr(iterator, "close", None)
            if close:
                close()

    def _change(self, event: Obj) -> tuple[ingest.Change | None, int | None]:
        """A watch event as an ingest change (None for bookmarks and skipped objects) and its version."""
        kind = event.get("type")
        obj = event.get("object")
        if kind == "ERROR":
            raise status_error(obj if isinstance(obj, dict) else {})
        if not isinstance(obj, dict):
            log.warning("%s/%s: watch event without an object skipped", self.cluster.name, self.kind)
            return None, None
        try:
            rv = parse_resource_version((obj.get("metadata") or {}).get("resourceVersion"), self.kind)
        except NormalizeError as exc:
            log.warning("%s/%s: skipping event: %s", self.cluster.name, self.kind, exc)
            return None, None
        if kind == "BOOKMARK":
            return None, rv
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            log.warning("%s/%s: unknown watch event type %r skipped", self.cluster.name, self.kind, kind)
            return None, rv
        if kind != "DELETED" and not is_stored(self.kind, obj):
            return None, rv
        try:
            record = normalize(self.kind, obj)
        except NormalizeError as exc:
            log.warning("%s/%s: skipping malformed object: %s", self.cluster.name, self.kind, exc)
            return None, rv
        return ingest.Change("delete" if kind == "DELETED" else "upsert", record), rv

    def _flush(self, changes: list[ingest.Change], resource_version: int) -> int:
        ingest.apply_batch(self.cluster, self.kind, changes, cursor=ingest.CursorUpdate(resource_version))
        self.events_applied += len(changes)
        return resource_version

    # ----------------------------------------------------------------------------------------- loop

    def round(self, stop: threading.Event, failures: int = 0) -> Round:
        """One round: resume from the cursor (or relist), then watch until the server ends the watch.

        Every fault is handled here and turns into the delay before the next round, so a caller (the
        foreground loop or a Celery task that re-enqueues itself) never sees an exception from the source.
        """
        try:
            rv = self.stored_resource_version()
            if rv is None:
                rv = self.relist()
            self.watch(rv, stop)
            return Round("watched", 0.0, 0)
        except Gone as exc:
            log.info("%s/%s: %s; relisting", self.cluster.name, self.kind, exc)
            # "listing" drops the cursor: the next round lists and replaces, deleting what is gone.
            self.record_state("listing", str(exc))
            return Round("gone", 0.0, 0)
        except Forbidden as exc:
            log.warning("%s/%s: forbidden: %s", self.cluster.name, self.kind, exc)
            self.record_state("forbidden", str(exc))
            self._settle_read_model()
            return Round("forbidden", self.config.forbidden_retry, failures)
        except (SourceError, OSError, DatabaseError) as exc:
            # OSError: connection refused/reset below the client; DatabaseError: PostgreSQL went away.
            delay = self.backoff(failures)
            log.warning("%s/%s: %s; retrying in %.1fs", self.cluster.name, self.kind, exc, delay)
            if isinstance(exc, DatabaseError):
                close_old_connections()
            self.record_state("backoff", f"{type(exc).__name__}: {exc}")
            self._settle_read_model()
            return Round("backoff", delay, failures + 1)

    def backoff(self, failures: int) -> float:
        return self.backoff_for(self.config, failures)

    @staticmethod
    def backoff_for(config: StreamConfig, failures: int) -> float:
        """About backoff_min, doubling per consecutive failure up to backoff_max, with +-20% jitter."""
        base = min(config.backoff_max, config.backoff_min * (2 ** min(failures, 16)))
        return base * random.uniform(0.8, 1.2)

    def record_state(self, state: str, error: str) -> None:
        try:
            self.set_state(state, error)
        except DatabaseError as exc:  # the database is down too; the next round records the state
            log.warning("%s/%s: cannot record state %s: %s", self.cluster.name, self.kind, state, exc)
            close_old_connections()
            connection.close()

    def run(self, stop: threading.Event, max_watches: int | None = None) -> None:
        """Rounds until ``stop`` is set (or ``max_watches`` watches ended normally)."""
        failures = 0
        watches = 0
        while not stop.is_set() and (max_watches is None or watches < max_watches):
            result = self.round(stop, failures)
            failures = result.failures
            watches += result.outcome == "watched"
            if result.delay:
                stop.wait(result.delay)


def ingest_list(cluster: Cluster, kind: str, pages: Iterable[Sequence[Obj]], resource_version: int) -> int:
    """Normalize a list's objects and replace the stored set with them; returns how many were stored.

    The list arrives in pages (the API server's ``limit``/``continue``) and goes through normalize into the
    database page by page: ingest consumes the records lazily, so no more than a page or two of decoded
    objects and records is alive at a time, whatever the size of the kind. On an initial sync that also
    overlaps normalizing with the database's COPY of the rows already sent.

    Each (cluster, kind) stream calls this from its own worker thread with its own database connection, so
    a cluster's kinds are listed and stored at the same time: their COPYs run in separate PostgreSQL
    backends (other cores), and one stream's Python work runs while another waits on its socket. The
    initial sync's exclusive lock is per (cluster, kind), so kinds never wait for each other.
    ``bench/bench_sync.py fleet`` measures exactly that. Normalizing in a separate process was weighed and
    left out: on the 2-core benchmark machine the sync is bound by its total CPU (about 7.5 s of Python,
    all threads, and 8.5 s of server for the L fleet), which a second process cannot lower, and shipping
    the objects there and the records back (the history hook and the children need them) would add to it.
    """
    report = ImportReport()
    chunks = (
        normalize_many(kind, page[i : i + NORMALIZE_PAGE], report)
        for page in pages
        for i in range(0, len(page), NORMALIZE_PAGE)
    )
    with cyclic_gc_paused():
        result = ingest.replace_all(cluster, kind, (r for chunk in chunks for r in chunk), resource_version)
    return len(result.written) + result.stale


NORMALIZE_PAGE = 500  # objects normalized at a time by ingest_list


@dataclass(frozen=True)
class Round:
    """How a round ended: watched / gone / forbidden / backoff; the delay before the next one; the
    number of consecutive failures (for the backoff)."""

    outcome: str
    delay: float
    failures: int
