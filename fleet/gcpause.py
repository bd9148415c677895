"""One process-wide pause of Python's cyclic garbage collector, shared by every code path that builds or
holds large trees of long-lived objects (relists, fleet loads, the incremental diagnosis)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_gc_lock = threading.Lock()
_gc_pauses = 0  # code paths running in this process under cyclic_gc_paused
_gc_was_enabled = False  # whether the collector was on when the first of them began


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (first written for relists).

    Normalizing a large list creates hundreds of thousands of long-lived objects while the decoded list
    (millions of dicts, lists and strings) is alive: that triggers repeated full collections, each walking
    every one of those objects, for a third to half of normalize's time on the 5,000-node benchmark. Decoded
    JSON and records are trees, so reference counting frees them all the same; the collector resumes (if
    it was on) when the list is stored and picks up whatever cycles were left meanwhile. It is
    process-wide: other threads of this worker run those seconds without cyclic collection too, which only
    delays freeing their cycles.

    The worker's threads relist a cluster's kinds at the same time (all seven streams start together), so
    the pauses overlap: the collector stays off until the last one ends, and comes back on only if it was
    on when the first one began (a plain save-and-restore per pause would turn it back on as soon as the
    first relist ended, under the others still running).
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()
