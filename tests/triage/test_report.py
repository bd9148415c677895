"""The pure report on hand-made history: waits, what freed capacity for them, clean-up, leaks, visibility."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from claims.triage.report import TriageData, build_report

T0 = datetime(2026, 3, 6, 18, 0, tzinfo=UTC)
UNTIL = T0 + timedelta(days=2)


def change(
    uid: str, ns: str, frm: str, to: str, minutes: float, devices: tuple[str, ...] = ()
) -> dict[str, Any]:
    name = f"claim-{uid}"
    node = "node-a" if devices else ""
    at = T0 + timedelta(minutes=minutes)
    return {"cluster": "c", "uid": uid, "namespace": ns, "name": name, "from_state": frm, "to_state": to,
            "at": at, "node": node, "devices": list(devices)}  # fmt: skip


def capacity_cause(uid: str, ns: str, minutes: float) -> dict[str, Any]:
    group = {"model": "B200", "profile": "", "matching": 16, "free": 0, "devices": 16}
    result = {
        "category": "capacity",
        "summary": "Request gpus needs 1: 16 devices match (16 B200), 0 free.",
        "requests": [
            {
                "name": "gpus",
                "count": 1,
                "free": 0,
                "matching": 16,
                "device_class": "gpu.nvidia.com",
                "selectors": [],
                "groups": [group],
            }
        ],
        "suggestions": ["Wait for a holder to finish."],
    }
    at = T0 + timedelta(minutes=minutes)
    seen = {"first_seen": at, "last_seen": at + timedelta(hours=1)}
    return {
        "cluster": "c",
        "uid": uid,
        "category": "capacity",
        "group_key": "k",
        "summary": "",
        "result": result,
        **seen,
    }


def data(changes: list[dict[str, Any]], causes: list[dict[str, Any]]) -> TriageData:
    held = ("gpu.nvidia.com/node-a/gpu-0",)
    lifecycles = {
        ("c", c["uid"]): {"node": "node-a", "devices": list(held), "allocated_at": c["at"]}
        for c in changes
        if c["to_state"] in ("allocated", "reserved")
    }
    return TriageData(
        since=T0,
        until=UNTIL,
        cluster=None,
        changes=sorted(changes, key=lambda c: (c["uid"], c["at"])),
        lifecycles=lifecycles,
        causes=causes,
        devices={("c", held[0]): ("B200", "")},
    )


HELD = ("gpu.nvidia.com/node-a/gpu-0",)
HISTORY = [
    # "holder" holds a B200 from the start and releases it at 10:00 (+16 h), then is deleted (clean-up)
    change("holder", "train", "", "pending", -60),
    change("holder", "train", "pending", "reserved", -60, HELD),
    change("holder", "train", "reserved", "pending", 16 * 60, HELD),
    change("holder", "train", "pending", "deleted", 16 * 60),
    # "waiter" waits from +1 h and gets the B200 when it is freed
    change("waiter", "train", "", "pending", 60),
    change("waiter", "train", "pending", "reserved", 16 * 60 + 1, HELD),
    # "quick" is allocated within seconds: not a wait
    change("quick", "serve", "", "pending", 120),
    change("quick", "serve", "pending", "reserved", 120.5, ("gpu.nvidia.com/node-b/gpu-1",)),
    # "gaveup" waits two hours and is deleted
    change("gaveup", "serve", "", "pending", 180),
    change("gaveup", "serve", "pending", "deleted", 300),
    # "notebook" is reserved, then its pod goes: allocated, reserved by nobody, for the rest of the window
    change("notebook", "serve", "", "pending", 0),
    change("notebook", "serve", "pending", "reserved", 0, ("gpu.nvidia.com/node-c/gpu-2",)),
    change("notebook", "serve", "reserved", "allocated", 30),
]


def test_waits_are_listed_longest_first_with_their_outcome():
    report = build_report(data(HISTORY, [capacity_cause("waiter", "train", 90)]), lambda c, n: True)
    rows = [(p["name"], p["outcome"], p["seconds"], p["category"]) for p in report["pended"]]
    assert rows == [
        ("claim-waiter", "allocated", 15 * 3600 + 60, "capacity"),
        ("claim-gaveup", "deleted", 2 * 3600, "undiagnosed"),
    ]
    assert report["totals"]["allocated_promptly"] == 1  # quick (the others waited before the window)
    assert report["pended"][0]["node"] == "node-a"


def test_a_release_is_matched_with_the_claims_waiting_for_such_devices():
    report = build_report(data(HISTORY, [capacity_cause("waiter", "train", 90)]), lambda c, n: True)
    assert report["freed"] == [
        {
            "at": "2026-03-07T10:00:00Z",
            "cluster": "c",
            "namespace": "train",
            "name": "claim-holder",
            "node": "node-a",
            "devices": 1,
            "models": ["B200"],
            "waiting": 1,
            "waiting_examples": ["train/claim-waiter"],
        }
    ]


def test_an_unreserved_allocation_past_the_threshold_is_a_leak():
    report = build_report(data(HISTORY, []), lambda c, n: True)
    assert [(x["name"], x["unreserved_since"]) for x in report["leaks"]] == [
        ("claim-notebook", "2026-03-06T18:30:00Z")
    ]


def test_foreign_namespaces_are_counted_not_named():
    report = build_report(data(HISTORY, [capacity_cause("waiter", "train", 90)]), lambda c, n: n == "serve")
    assert [p["name"] for p in report["pended"]] == ["claim-gaveup"]
    assert report["totals"]["hidden"] == 1
    assert report["freed"] == [] and report["totals"]["freed"] == 1
    anonymous = [c for c in report["causes"] if not c["key"]]
    assert [(c["category"], c["count"], c["examples"]) for c in anonymous] == [("capacity", 1, [])]
    assert "train" not in str(report["causes"]) and "claim-waiter" not in str(report)
