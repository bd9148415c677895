"""Match a finished ``bench_e2e.py`` run's probes again from its files: the heatmap latency and the pending
latency (change -> ``/ws/pending/``), the latter both with every diagnosis run counted (skipped runs too,
as runs recorded before ``diagnosis_runs`` left them out were counted) and with only the runs that applied
changes; each from the time the change log took the change where the run kept its log
(``change-log.json``), and from the time the heatmap showed it; each told by the first message after the
applying run's end, and, where the run kept them (``ws-pending-diagnosed.json``), by the first message
announcing diagnoses stored since the run's start.

    python bench/e2e/rematch.py RUN_DIR [RUN_DIR ...]

Reads ``probes.jsonl``, ``ws-changes.json`` (the cell changes the feed client saw), ``ws-pending.json``
(when the pending client was told), ``ws-pending-diagnosed.json`` if kept, ``worker-diagnosis.log``,
``change-log.json`` and ``change.done`` (the quiet change after the churn: runs after it are not the
churn's).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.bench_e2e import Logged, diagnosis_runs, latencies, logged_at, pending_latencies, quantiles


def rematch(run_dir: Path) -> dict[str, Any]:
    probes = [json.loads(line) for line in (run_dir / "probes.jsonl").read_text().splitlines()]
    changes: dict[tuple[str, int], list[tuple[float, int, int]]] = defaultdict(list)
    for row, index, *change in json.loads((run_dir / "ws-changes.json").read_text()):
        changes[(row, index)].append(tuple(change))
    shown, missed, matched = latencies(probes, SimpleNamespace(changes=changes))  # type: ignore[arg-type]
    kept = run_dir / "change-log.json"
    entries: Logged = {}
    if kept.exists():
        entries = {(kind, key): times for kind, key, times in json.loads(kept.read_text())}
    starts = {
        "from the change log": logged_at(matched, shown, entries),
        "from the heatmap": [when for _, when in shown],
    }
    told = sorted(json.loads((run_dir / "ws-pending.json").read_text()))
    kept_diagnosed = run_dir / "ws-pending-diagnosed.json"
    tellings: dict[str, list[tuple[float, float]] | None] = {"after the run's end": None}
    if kept_diagnosed.exists():
        tellings["by diagnosed_at"] = [(r, a) for r, a in json.loads(kept_diagnosed.read_text())]
    log = run_dir / "worker-diagnosis.log"
    change = run_dir / "change.done"
    quiet = json.loads(change.read_text())["t"] if change.exists() else float("inf")
    out: dict[str, Any] = {
        "heatmap": {"matched": len(shown), "missed": missed, **quantiles([w - t for t, w in shown], 3)}
    }
    ways = (("every run counted", True), ("runs that applied changes", False))
    for name, include_skipped in ways:
        runs = diagnosis_runs(log, include_skipped)
        during = [(end, d) for end, d in runs if end - d < quiet]
        for since, at in starts.items():
            seen = [(t, a) for (t, _), a in zip(shown, at, strict=True)]
            for told_how, diagnosed in tellings.items():
                if diagnosed is not None and include_skipped:
                    # A skipped run would take the message of the run it skipped for, which started
                    # before the change and did not apply it: too early.
                    continue
                lat, lost = pending_latencies(seen, during, told, diagnosed)
                out[f"pending, {name}, {since}, told {told_how}"] = {
                    "runs": len(during),
                    "matched": len(lat),
                    "missed": lost,
                    **quantiles(lat, 2),
                }
    return out


def main(dirs: list[str]) -> int:
    for d in dirs:
        print(d)
        for name, figures in rematch(Path(d)).items():
            print(f"  {name}: {figures}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
