"""Dicts that share one table of keys with every other dict of the same keys in the same order.

The lean fleet holds millions of small dicts of a few layouts: a published device (``name``,
``attributes``, ``capacity``, ...), a device's attributes (a dozen names, one of them a UUID, so no two
equal), ``{"string": ...}`` values, a claim's metadata. A plain dict stores its keys and their hashes
with every copy: 480 bytes for a dynamic-MIG device's attributes. CPython (3.11, the version we pin)
keeps the instance dicts of one class in *split* form instead, the keys once per class and 8 bytes per
value in each dict: 200 bytes for the same attributes. :func:`keyshared` makes such a dict for any
layout of string keys, through a class per layout.

What it returns is a ``dict`` like any other: equal, iterated in the same order, serialized alike, and
changing it is allowed (a key added out of order turns it back into a plain dict, which costs memory,
not correctness). No library offers this; ``__slots__`` classes or named tuples would change the type
that the diagnosis, CEL and JSON read.
"""

from __future__ import annotations

from typing import Any

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
        if len(keys) > MAX_KEYS or len(_classes) >= MAX_LAYOUTS or not all(type(k) is str for k in keys):
            return values
        made = _classes[keys] = type("KeyShared", (), {})
    out: dict[str, Any] = made().__dict__
    # Key by key: the split form holds while keys come in the class's order; update() makes it plain.
    for key, value in values.items():
        out[key] = value
    return out


def layouts() -> int:
    """How many layouts have a class (for tests)."""
    return len(_classes)
