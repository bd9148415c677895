"""A relist that finds nothing changed, on the L fleet: ingest's time and what it writes, with the
resourceVersion fence letting equal versions through (before) and stopping them (after), back to back.

    DATABASE_URL=postgres://.../claimscope_<scratch> SECRET_KEY=... \
        .venv/bin/python bench/e2e/relist_unchanged.py [rounds]

The scratch database must hold the L fleet as cluster "sim" (``bench/e2e/load_fleet.py``, or a copy of a
database it filled). Every kind is listed from the same simulated objects and normalized once; each round
times ``ingest.replace_all`` of every kind, "after" then "before". Change events are counted, not sent.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

from bench.e2e.simserver import build  # noqa: E402
from fleet import ingest  # noqa: E402
from fleet.importer import INGEST_ORDER, ImportReport, normalize_many  # noqa: E402

_fenced = ingest.sql.conflict_sql
_stored_versions = ingest.apply.stored_versions


def _equal_passes(*args: Any, **kwargs: Any) -> str:
    """The fence before: an equal resourceVersion is rewritten."""
    return _fenced(*args, **kwargs).replace(" < excluded.", " <= excluded.")


def _nothing_stored(*args: Any) -> dict[Any, Any]:
    """Before: replace_all sent every listed record to the upsert."""
    return {}


def use(mode: str) -> None:
    after = mode == "after"
    ingest.sql.conflict_sql = _fenced if after else _equal_passes
    ingest.apply.stored_versions = _stored_versions if after else _nothing_stored  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 2
    sim, _, _ = build("L")
    cluster = ingest.get_or_create_cluster("sim")
    events: list[dict[str, Any]] = []
    ingest.events._notify = events.append  # type: ignore[assignment]  # no channel layer, no diagnosis trigger
    lists: dict[str, tuple[list[Any], int]] = {}
    for kind in INGEST_ORDER:
        objects, listed_at = sim.list(kind)
        lists[kind] = (normalize_many(kind, objects, ImportReport()), int(listed_at))
    for _ in range(rounds):
        for mode in ("after", "before"):
            use(mode)
            events.clear()
            total = 0.0
            parts = []
            for kind in INGEST_ORDER:
                records, version = lists[kind]
                t = time.perf_counter()
                result = ingest.replace_all(cluster, kind, records, version)
                took = time.perf_counter() - t
                total += took
                parts.append(f"{kind} {len(records)}: {took:.2f}s wrote {len(result.written)}")
            load = "/".join(f"{x:.1f}" for x in os.getloadavg())
            print(f"{mode:6} total {total:6.2f}s, {len(events)} change events, load {load}")
            for part in parts:
                print("    " + part)
    use("after")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
