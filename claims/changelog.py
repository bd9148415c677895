"""The fleet change events of each cluster, in commit order, for the incremental diagnosis.

Ingest's change listener (``claims.tasks.on_fleet_change``) appends each event; the diagnosis worker
(one process on the "diagnosis" queue) reads the events after its own position and applies them to its
in-memory fleet (``claims.livestate``); any other process that ran an update would keep its own position
and fleet, so it would not matter which process a task lands on. On Redis: one stream per cluster, capped at
``MAX_EVENTS``, each entry numbered by a counter in the same atomic step, so a reader that fell behind the
cap sees the gap (and reloads) instead of missing events. Without Redis (the demo, tasks run in-process):
a list in this process.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any

import orjson
from django.conf import settings

log = logging.getLogger(__name__)
MAX_EVENTS = 20_000  # per cluster; a reader further behind reloads its fleet
# The entry and its number in one step: two appending processes cannot interleave them.
_APPEND = """
local n = redis.call('INCR', KEYS[2])
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', 'n', n, 'e', ARGV[1])
return n
"""
# The position of the newest entry (its id and number), read together.
_POSITION = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local n = tonumber(redis.call('GET', KEYS[2]) or '0')
if #last == 0 then return {'0-0', n} end
return {last[1][1], n}
"""


@dataclass(frozen=True)
class Position:
    entry: str  # the stream id of the last event read ("0-0": none)
    number: int  # its number (the counter's value when it was appended)


class Gap(Exception):
    """Events after the reader's position were dropped (the cap): the reader must reload."""


_local: dict[str, list[tuple[int, dict[str, Any]]]] = {}  # (number, event)
_local_lock = threading.Lock()
_counts: dict[str, int] = {}


def _keys(cluster: str) -> tuple[str, str]:
    return stream_key(cluster), f"claimscope:diagnoses:events-n:{cluster}"


def stream_key(cluster: str) -> str:
    """The Redis stream of ``cluster``'s events (entries ``n``: number, ``e``: the event as JSON); the
    benchmark reads when each change was logged from it."""
    return f"claimscope:diagnoses:events:{cluster}"


def _client() -> Any:
    url = getattr(settings, "REDIS_URL", None)
    if not url:
        return None
    return redis_client(url)


@functools.lru_cache(maxsize=8)
def redis_client(url: str) -> Any:
    """One client (and connection pool, thread-safe) per URL and process: a client per call opened a TCP
    connection per call, 6% of the diagnosis worker's time under churn."""
    import redis

    return redis.Redis.from_url(url)


def append(cluster: str, event: dict[str, Any]) -> None:
    client = _client()
    if client is None:
        with _local_lock:
            number = _counts[cluster] = _counts.get(cluster, 0) + 1
            _local.setdefault(cluster, []).append((number, event))
            del _local[cluster][:-MAX_EVENTS]
        return
    client.eval(_APPEND, 2, *_keys(cluster), orjson.dumps(event), MAX_EVENTS)


def position(cluster: str) -> Position:
    """Where the log of ``cluster`` ends now: read it before loading the fleet, then apply what follows."""
    client = _client()
    if client is None:
        with _local_lock:
            return Position("0-0", _counts.get(cluster, 0))
    entry, number = client.eval(_POSITION, 2, *_keys(cluster))
    return Position(entry.decode() if isinstance(entry, bytes) else str(entry), int(number))


def read(cluster: str, after: Position) -> tuple[list[tuple[int, dict[str, Any]]], Position]:
    """The events after ``after``, each with its number, and the new position. Raises :class:`Gap` when
    some were dropped."""
    client = _client()
    if client is None:
        with _local_lock:  # the count and the list together: ingest threads append meanwhile
            kept = list(_local.get(cluster, []))
            now = _counts.get(cluster, 0)
        if now > after.number and (not kept or kept[0][0] > after.number + 1):
            raise Gap(cluster)
        return [(n, e) for n, e in kept if n > after.number], Position("0-0", now)
    stream, counter = _keys(cluster)
    entries = client.xrange(stream, min=f"({after.entry}" if after.entry != "0-0" else "-", max="+")
    if not entries:
        now = int(client.get(counter) or 0)
        if now != after.number:
            raise Gap(cluster)
        return [], after
    first = int(entries[0][1][b"n"])
    if first != after.number + 1:
        raise Gap(cluster)
    events = [(int(fields[b"n"]), orjson.loads(fields[b"e"])) for _, fields in entries]
    last_id, last_fields = entries[-1]
    return events, Position(last_id.decode(), int(last_fields[b"n"]))
