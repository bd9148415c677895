"""A Redis lock per (cluster, kind) stream: a random token, a TTL, a heartbeat, and hand-over.

One stream is watched by one task at a time. The owner extends the TTL from a heartbeat thread; if the
owner dies, the lock lapses after the TTL and the beat task starts a new owner. A task hands the lock to
its successor (the task it re-enqueues) by swapping the token atomically, so a redelivered copy of an old
message (acks_late) finds a token it does not hold and exits. Even when two writers overlap (a network
partition outlasting the TTL), ingest's resourceVersion fence keeps the database correct.
"""

from __future__ import annotations

import logging
import secrets
import threading
from typing import Any, cast

import redis

log = logging.getLogger(__name__)

PREFIX = "claimscope:stream:"

# Extend our own lock; reclaim it if it vanished (a Redis restart without persistence loses keys).
_EXTEND = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if not v then return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') and 1 or 0 end
return 0
"""
# Hand the lock from one token to the next, with a new TTL, only if we still hold it.
_SWAP = """
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] or not v then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def stream_key(cluster: str, kind: str) -> str:
    return f"{PREFIX}{cluster}:{kind}"


def new_token() -> str:
    return secrets.token_hex(12)


class StreamLock:
    """The lock of one stream, held under ``token``."""

    def __init__(self, client: redis.Redis, cluster: str, kind: str, ttl: float, token: str = "") -> None:
        self.client = client
        self.key = stream_key(cluster, kind)
        self.ttl_ms = max(1000, int(ttl * 1000))
        self.token = token or new_token()

    def _eval(self, script: str, *args: Any) -> int:
        return int(cast(Any, self.client.eval(script, 1, self.key, *args)))

    def acquire(self) -> bool:
        """Take a free lock, or confirm (and extend) one handed to our token."""
        if self.client.set(self.key, self.token, px=self.ttl_ms, nx=True):
            return True
        return self.extend()

    def extend(self, ttl_ms: int | None = None) -> bool:
        return self._eval(_EXTEND, self.token, ttl_ms or self.ttl_ms) == 1

    def hand_over(self, ttl_ms: int) -> str | None:
        """A new token for the successor, holding the lock for ``ttl_ms``; None if we lost the lock."""
        successor = new_token()
        if self._eval(_SWAP, self.token, successor, ttl_ms) != 1:
            return None
        self.token = successor
        return successor

    def release(self) -> None:
        self._eval(_RELEASE, self.token)

    def held_by_anyone(self) -> bool:
        return bool(self.client.exists(self.key))


class Heartbeat:
    """Extends a lock every third of its TTL; sets ``lost`` (and ``stop``) when someone else holds it.

    A Redis outage is not a loss: the watch goes on (the fence makes a duplicate harmless) and the lock
    is reclaimed when Redis is back.
    """

    def __init__(self, lock: StreamLock, stop: threading.Event) -> None:
        self.lock = lock
        self.stop = stop
        self.lost = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {lock.key}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(5)

    def _beat(self) -> None:
        interval = self.lock.ttl_ms / 3000
        while not self._done.wait(interval):
            try:
                held = self.lock.extend()
            except redis.RedisError as exc:
                log.warning("%s: heartbeat failed (%s); watching on", self.lock.key, exc)
                continue
            if not held:
                log.warning("%s: lock taken by another worker; stopping this stream", self.lock.key)
                self.lost.set()
                self.stop.set()
                return
