"""Dicts that share one table of keys with every other dict of the same keys in the same order.

The lean fleet holds millions of small dicts of a few layouts: a published device (``name``,
``attributes``, ``capacity``, ...), a device's attributes (a dozen names, one of them a UUID, so no two
equal), ``{"string": ...}`` values, a claim's metadata. A plain dict stores its keys and their hashes
with every copy: 480 bytes for a dynamic-MIG device's attributes. CPython (3.11, the version we pin)
keeps the instance dicts of one class in *split* form instead, the keys once per class and 8 bytes per
value in each dict: 200 bytes for the same attributes. :func:`keyshared` makes such a dict for any
layout of string keys, through a class per layout.

What it returns is a ``dict`` like any other: equal, iterated in the same order, serialized alike, and
changing it is allowed (it may then cost more memory, never correctness). No library offers this;
``__slots__`` classes or named tuples would change the type that the diagnosis, CEL and JSON read. Meant
for dicts whose keys a schema fixes: each layout keeps a class for the life of the process.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

# CPython shares a class's key table up to this many keys; a longer dict would be a plain one anyway.
MAX_KEYS = 30
# Layouts are few (a device, its attributes per model, a claim's parts); free-form maps (labels) are
# not: past this many layouts a new one gets a plain dict, so the classes stay bounded.
MAX_LAYOUTS = 4096

_classes: dict[tuple[str, ...], type] = {}


def keyshared(values: dict[str, Any]) -> dict[str, Any]:
    """A dict equal to ``values``, in its order, sharing its key table with the other dicts of its
    layout; ``values`` itself when it cannot (a key not a string, too many keys or layouts)."""
    keys = tuple(values)
    made = _classes.get(keys)
    if made is None:
        if len(keys) > MAX_KEYS or not all(type(k) is str for k in keys):
            return values
        if len(_classes) >= MAX_LAYOUTS:
            _full()
            return values
        # Two threads missing at once use one class: setdefault keeps the first one made.
        made = _classes.setdefault(keys, type("KeyShared", (), {}))
    out: dict[str, Any] = made().__dict__
    # Key by key, in order: the class's key table is filled in this order by its first dict.
    for key, value in values.items():
        out[key] = value
    return out


_said_full = False


def _full() -> None:
    global _said_full
    if not _said_full:
        _said_full = True
        log.warning("keyshared: %d layouts of dict keys; a new layout is a plain dict", MAX_LAYOUTS)


def layouts() -> int:
    """How many layouts have a class (for tests)."""
    return len(_classes)
