"""``manage.py watch``: every stream of the chosen clusters in threads of this process, round after round.

The same rounds as the Celery task. With Redis configured each stream also takes its lock, so a foreground
watcher and the workers never both write a stream; without Redis (the demo) it runs unlocked.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from django.db import connection

from fleet import clusters
from fleet.kube import streams
from fleet.kube.reflector import Round

log = logging.getLogger(__name__)


def run_stream(name: str, kind: str, stop: threading.Event, use_lock: bool) -> None:
    """Rounds of one stream until ``stop``; waits (and retries) while another owner holds its lock."""
    token = ""
    failures = 0
    client = streams.redis_client() if use_lock else None
    try:
        while not stop.is_set():
            if client is None:
                result: Round | None = streams.run_round(name, kind, stop, failures)
            else:
                result, successor = streams.locked_round(client, name, kind, stop, token, failures)
                token = successor or ""
            if result is None:  # someone else watches it: check again after a lock period
                stop.wait(streams.lock_ttl())
                continue
            failures = result.failures
            if result.delay:
                stop.wait(result.delay)
    finally:
        connection.close()  # this thread's own connection


def start(
    configs: Sequence[clusters.ClusterConfig], kinds: Sequence[str], stop: threading.Event, use_lock: bool
) -> list[threading.Thread]:
    threads = []
    for config in configs:
        for kind in kinds:
            thread = threading.Thread(
                target=run_stream, args=(config.name, kind, stop, use_lock), name=f"{config.name}/{kind}"
            )
            thread.start()
            threads.append(thread)
    return threads
