"""The Monday-morning triage report: what pended in a window, why, what freed capacity, allocation, leaks.

:func:`build_report` is pure: it takes :class:`TriageData` (rows read by ``claims.triage.selectors``) and a
``Visibility`` and returns plain data (JSON-ready dicts), which the page, the API and the ``triage`` command
render, so all three show the same numbers. ``claims.triage.window`` decides the window.

What counts:
- a claim *pended* in the window if one of its pending intervals (from ``ClaimStateChange``) overlaps it and
  lasted at least ``min_pending`` (60 s: a scheduler's normal latency is not a wait). A pending interval that
  starts with a release and ends with the claim's deletion is clean-up, not a wait. Its duration runs to its
  end, or to ``until`` if it was still pending then.
- its cause is the last cause the diagnosis gave while it pended (``PendingCause``); groups come from
  ``claims.causes.group_causes``.
- *freed* capacity: claims that released devices in the window (deallocated or deleted while holding), with
  the claims then waiting whose blocking request matches the released devices' model/profile.
- *leaks*: claims allocated and reserved by nobody at ``until`` for at least the leak threshold.
- *MIG exhaustion*: the periods a MIG profile was diagnosed exhausted while bigger slices sat idle
  (fragmentation causes), with the idle slices the diagnosis counted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from claims.causes import Pending, blocking_request, group_causes
from claims.triage.window import duration_text
from fleet.access.visibility import redact_text_for

HOLDING = frozenset({"allocated", "reserved", "deallocating"})
MIN_PENDING = timedelta(seconds=60)
HIDDEN = "another namespace"
SECTIONS = ("pended", "causes", "freed", "leaks", "mig_exhaustion", "allocation")
Row = dict[str, Any]
Allows = Callable[[str, str], bool]


# ------------------------------------------------------------------------------------------- data


@dataclass
class TriageData:
    """What the report is computed from (see ``claims.triage.selectors.load``).

    ``changes``: ``ClaimStateChange`` rows (cluster, uid, namespace, name, from_state, to_state, at, node,
    devices) ordered by (cluster, uid, at, id), for claims that changed in or before the window;
    ``lifecycles`` by (cluster, uid); ``causes``: ``PendingCause`` rows; ``samples``: ``AllocationSample``
    rows (time, cluster, model, profile, total, allocated) in the window; ``devices`` maps
    ``(cluster, "driver/pool/device")`` to ``(model, MIG profile)``."""

    since: datetime
    until: datetime
    cluster: str | None
    changes: list[Row] = field(default_factory=list)
    lifecycles: dict[tuple[str, str], Row] = field(default_factory=dict)
    causes: list[Row] = field(default_factory=list)
    samples: list[Row] = field(default_factory=list)
    devices: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    leak_after: timedelta = timedelta(hours=1)
    min_pending: timedelta = MIN_PENDING
    default: bool = False


@dataclass
class _Interval:
    cluster: str
    uid: str
    namespace: str
    name: str
    start: datetime
    end: datetime | None
    ended_by: str  # the state it went to ("" while pending)
    after_release: bool


def _iso(t: datetime | None) -> str | None:
    return None if t is None else t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _pending_intervals(changes: Iterable[Row]) -> list[_Interval]:
    out: list[_Interval] = []
    open_: dict[tuple[str, str], _Interval] = {}
    for c in changes:
        key = (c["cluster"], c["uid"])
        current = open_.pop(key, None)
        if current is not None:
            current.end, current.ended_by = c["at"], c["to_state"]
        if c["to_state"] == "pending":
            interval = _Interval(
                c["cluster"], c["uid"], c["namespace"], c["name"], c["at"], None, "",
                c["from_state"] in HOLDING,
            )  # fmt: skip
            out.append(interval)
            open_[key] = interval
    return out


def _state_at(changes: Iterable[Row], at: datetime) -> dict[tuple[str, str], Row]:
    """Each claim's last change at or before ``at``."""
    last: dict[tuple[str, str], Row] = {}
    for c in changes:
        if c["at"] <= at:
            last[(c["cluster"], c["uid"])] = c
    return last


def _wanted(result: Mapping[str, Any] | None) -> set[tuple[str, str]]:
    """(model, profile) of the device groups matching a diagnosis' blocking request."""
    request = blocking_request(result or {})
    if request is None:
        return set()
    return {
        (str(g.get("model", "")), str(g.get("profile", "")))
        for g in request.get("groups") or []
        if int(g.get("matching") or 0) > 0
    }


def build_report(data: TriageData, allows: Allows) -> Row:
    """The report (plain JSON-ready data); only claims ``allows(cluster, namespace)`` are named."""
    since, until = data.since, data.until
    causes_by_claim: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for row in data.causes:
        causes_by_claim[(row["cluster"], row["uid"])].append(row)

    # --- claims that pended
    pended: list[tuple[_Interval, float, Row | None, list[Row]]] = []
    prompt = 0
    for iv in _pending_intervals(data.changes):
        if iv.start >= until or (iv.end is not None and iv.end <= since):
            continue
        if iv.after_release and iv.ended_by == "deleted":
            continue  # released, then deleted: clean-up, not a wait
        end = min(iv.end, until) if iv.end is not None else until
        seconds = (end - iv.start).total_seconds()
        if seconds < data.min_pending.total_seconds():
            prompt += 1
            continue
        during = [
            c
            for c in causes_by_claim.get((iv.cluster, iv.uid), [])
            if c["last_seen"] >= iv.start and (iv.end is None or c["first_seen"] <= iv.end)
        ]
        during.sort(key=lambda c: (c["last_seen"], c["first_seen"], c["category"]))
        pended.append((iv, seconds, during[-1] if during else None, during))
    pended.sort(key=lambda p: (-p[1], p[0].start, p[0].cluster, p[0].namespace, p[0].name))

    items = [
        Pending(iv.cluster, iv.namespace, iv.name, iv.start, (cause or {}).get("result") or None, ref=i)
        for i, (iv, _, cause, _) in enumerate(pended)
    ]
    groups = group_causes(items)
    group_of: dict[int, Row] = {}
    cause_rows: list[Row] = []
    hidden_groups: dict[tuple[str, str], int] = defaultdict(int)
    for g in groups:
        visible = [m for m in g.members if allows(m.cluster, m.namespace)]
        if not visible:
            hidden_groups[(g.cluster, g.category)] += g.count
            continue
        row = {
            "key": g.key,
            "cluster": g.cluster,
            "category": g.category,
            # Summaries and suggestions name holder claims: hide those of other namespaces.
            "summary": redact_text_for(g.summary, allows, g.cluster),
            "count": g.count,
            "hidden": g.count - len(visible),
            "examples": [m.label for m in visible[:3]],
            "suggestion": redact_text_for(g.suggestion, allows, g.cluster),
        }
        cause_rows.append(row)
        for m in g.members:
            group_of[m.ref] = row
    for (cluster, category), count in sorted(hidden_groups.items()):
        cause_rows.append(
            {
                "key": "",
                "cluster": cluster,
                "category": category,
                "summary": f"{count} in other namespaces: {category}",
                "count": count,
                "hidden": count,
                "examples": [],
                "suggestion": "",
            }
        )

    pended_rows: list[Row] = []
    hidden_pended = 0
    for i, (iv, seconds, cause, during) in enumerate(pended):
        if not allows(iv.cluster, iv.namespace):
            hidden_pended += 1
            continue
        group = group_of.get(i)
        life = data.lifecycles.get((iv.cluster, iv.uid), {})
        pended_rows.append(
            {
                "cluster": iv.cluster,
                "namespace": iv.namespace,
                "name": iv.name,
                "pending_since": _iso(iv.start),
                "pending_until": _iso(iv.end) if iv.end is not None and iv.end <= until else None,
                "seconds": round(seconds),
                "outcome": _outcome(iv, until),
                "node": life.get("node", "") if iv.ended_by in HOLDING and iv.end and iv.end <= until else "",
                "category": (cause or {}).get("category", "undiagnosed"),
                "cause": group["summary"] if group else "",
                "cause_key": group["key"] if group else "",
                "categories": sorted({c["category"] for c in during}),
            }
        )

    freed, hidden_freed = _freed(data, pended, allows)
    leaks, hidden_leaks = _leaks(data, allows)
    return {
        "window": {
            "since": _iso(since),
            "until": _iso(until),
            "cluster": data.cluster,
            "default": data.default,
            "min_pending_seconds": round(data.min_pending.total_seconds()),
            "leak_after_seconds": round(data.leak_after.total_seconds()),
        },
        "totals": {
            "pended": len(pended),
            "still_pending": sum(1 for iv, *_ in pended if iv.end is None or iv.end > until),
            "allocated_after_wait": sum(
                1 for iv, *_ in pended if iv.ended_by in HOLDING and iv.end is not None and iv.end <= until
            ),
            "allocated_promptly": prompt,
            "hidden": hidden_pended,
            "freed": len(freed) + hidden_freed,
            "leaks": len(leaks) + hidden_leaks,
        },
        "pended": pended_rows,
        "causes": cause_rows,
        "freed": freed,
        "mig_exhaustion": _mig_exhaustion(data, pended),
        "leaks": leaks,
        "allocation": _allocation(data),
    }


def _outcome(iv: _Interval, until: datetime) -> str:
    if iv.end is None or iv.end > until:
        return "pending"
    return "allocated" if iv.ended_by in HOLDING else iv.ended_by


def _freed(
    data: TriageData, pended: list[tuple[_Interval, float, Row | None, list[Row]]], allows: Allows
) -> tuple[list[Row], int]:
    """Releases in the window, each with the waiting claims (then pending) that wanted such devices."""
    waiting = [(iv, _wanted((cause or {}).get("result"))) for iv, _, cause, _ in pended]
    rows: list[Row] = []
    hidden = 0
    for c in data.changes:
        if not (c["from_state"] in HOLDING and c["to_state"] in ("pending", "deleted")):
            continue
        if not (data.since <= c["at"] < data.until) or not c["devices"]:
            continue
        kinds = {data.devices.get((c["cluster"], d), ("", "")) for d in c["devices"]}
        matched = [
            iv
            for iv, wanted in waiting
            if iv.cluster == c["cluster"]
            and iv.start <= c["at"]
            and (iv.end is None or iv.end >= c["at"])
            and wanted & kinds
        ]
        if not allows(c["cluster"], c["namespace"]):
            hidden += 1
            continue
        rows.append(
            {
                "at": _iso(c["at"]),
                "cluster": c["cluster"],
                "namespace": c["namespace"],
                "name": c["name"],
                "node": c["node"],
                "devices": len(c["devices"]),
                "models": sorted({f"{m} {p}".strip() for m, p in kinds if m}),
                "waiting": len(matched),
                "waiting_examples": [
                    f"{iv.namespace}/{iv.name}" for iv in matched if allows(iv.cluster, iv.namespace)
                ][:3],
            }
        )
    return rows, hidden


def _leaks(data: TriageData, allows: Allows) -> tuple[list[Row], int]:
    rows: list[Row] = []
    hidden = 0
    for (cluster, uid), c in sorted(_state_at(data.changes, data.until).items()):
        if c["to_state"] != "allocated" or data.until - c["at"] < data.leak_after:
            continue
        if not allows(cluster, c["namespace"]):
            hidden += 1
            continue
        life = data.lifecycles.get((cluster, uid), {})
        rows.append(
            {
                "cluster": cluster,
                "namespace": c["namespace"],
                "name": c["name"],
                "node": life.get("node", ""),
                "devices": list(life.get("devices") or []),
                "allocated_at": _iso(life.get("allocated_at")),
                "unreserved_since": _iso(c["at"]),
                "seconds": round((data.until - c["at"]).total_seconds()),
            }
        )
    rows.sort(key=lambda r: (-r["seconds"], r["cluster"], r["namespace"], r["name"]))
    return rows, hidden


def _mig_exhaustion(
    data: TriageData, pended: list[tuple[_Interval, float, Row | None, list[Row]]]
) -> list[Row]:
    """Fragmentation causes merged per (cluster, model, profile): from the first diagnosis that found the
    profile exhausted with bigger slices idle to the last, clipped to the window."""
    spans: dict[tuple[str, str, str], Row] = {}
    for iv, _, _, during in pended:
        for cause in during:
            if cause["category"] != "fragmentation":
                continue
            request = blocking_request(cause.get("result") or {}) or {}
            for model, profile in sorted(_wanted(cause.get("result"))):
                key = (iv.cluster, model, profile)
                start, end = max(cause["first_seen"], data.since), min(cause["last_seen"], data.until)
                idle = {str(k): int(v) for k, v in (request.get("idle_bigger_mig") or {}).items()}
                span = spans.setdefault(
                    key,
                    {"cluster": iv.cluster, "model": model, "profile": profile, "start": start, "end": end,
                     "waiting": set(), "idle_bigger": {}},
                )  # fmt: skip
                span["start"], span["end"] = min(span["start"], start), max(span["end"], end)
                span["waiting"].add(iv.uid)
                for p, n in idle.items():
                    span["idle_bigger"][p] = max(span["idle_bigger"].get(p, 0), n)
    rows = []
    for key in sorted(spans):
        s = spans[key]
        rows.append(
            {
                "cluster": s["cluster"],
                "model": s["model"],
                "profile": s["profile"],
                "start": _iso(s["start"]),
                "end": _iso(s["end"]),
                "seconds": round((s["end"] - s["start"]).total_seconds()),
                "waiting": len(s["waiting"]),
                "idle_bigger": dict(sorted(s["idle_bigger"].items())),
            }
        )
    return rows


def _allocation(data: TriageData) -> list[Row]:
    """Per (cluster, model): allocated and total compute slices over the window (one series each)."""
    series: dict[tuple[str, str], Row] = {}
    for s in data.samples:
        if s["profile"]:
            continue
        row = series.setdefault(
            (s["cluster"], s["model"]),
            {"cluster": s["cluster"], "model": s["model"], "time": [], "allocated": [], "total": []},
        )
        row["time"].append(_iso(s["time"]))
        row["allocated"].append(s["allocated"])
        row["total"].append(s["total"])
    return [series[k] for k in sorted(series)]


def section_rows(report: Row, section: str) -> list[Row]:
    """The rows of one section for CSV (the allocation series as one row per point)."""
    if section == "allocation":
        return [
            {"cluster": s["cluster"], "model": s["model"], "time": t, "allocated": a, "total": n}
            for s in report["allocation"]
            for t, a, n in zip(s["time"], s["allocated"], s["total"], strict=True)
        ]
    return list(report[section])


def as_text(report: Row) -> str:
    """The report as plain text (the command's ``--format text``)."""
    w, t = report["window"], report["totals"]
    lines = [
        f"Triage {w['since']} .. {w['until']}" + (f" (cluster {w['cluster']})" if w["cluster"] else ""),
        f"{t['pended']} claims pended (>= {w['min_pending_seconds']}s): {t['still_pending']} still pending, "
        f"{t['allocated_after_wait']} allocated after waiting; {t['allocated_promptly']} allocated promptly"
        + (f"; {t['hidden']} in namespaces you cannot see" if t["hidden"] else ""),
        "",
        "Causes:",
    ]
    for c in report["causes"]:
        examples = ", ".join(c["examples"])
        lines.append(f"  [{c['category']}] {c['summary']}" + (f"  e.g. {examples}" if examples else ""))
        if c["suggestion"]:
            lines.append(f"      fix: {c['suggestion']}")
    lines += ["", "Pended, longest first:"]
    for p in report["pended"]:
        lines.append(
            f"  {duration_text(p['seconds']):>12}  {p['outcome']:<9} "
            f"{p['cluster']}/{p['namespace']}/{p['name']}  since {p['pending_since']}  [{p['category']}]"
        )
    lines += ["", "Freed capacity:"]
    lines += [
        f"  {f['at']}  {f['namespace']}/{f['name']} released {f['devices']} ({', '.join(f['models'])}) on "
        f"{f['node']}; {f['waiting']} waiting wanted them"
        for f in report["freed"]
    ] or ["  none"]
    lines += ["", "MIG profiles exhausted while bigger slices sat idle:"]
    lines += [
        f"  {m['model']} {m['profile']}: {m['start']} .. {m['end']} ({duration_text(m['seconds'])}), "
        f"{m['waiting']} waiting; idle: " + ", ".join(f"{n} x {p}" for p, n in m["idle_bigger"].items())
        for m in report["mig_exhaustion"]
    ] or ["  none"]
    lines += ["", f"Suspected leaks (allocated, no consumer for >= {w['leak_after_seconds']}s):"]
    lines += [
        f"  {x['cluster']}/{x['namespace']}/{x['name']} on {x['node']}: {len(x['devices'])} devices, "
        f"unreserved since {x['unreserved_since']} ({duration_text(x['seconds'])})"
        for x in report["leaks"]
    ] or ["  none"]
    return "\n".join(lines) + "\n"
