"""`make demo` on its embedded defaults: it serves the login page and, after login, a non-empty fleet; the
weekend it simulated just ended, so the pending page shows ages of hours and days and the weekend's triage
report (the link it prints) has the scenario's pending claims with their weekend-long waits."""

import re
import socket
import time
from datetime import UTC, datetime, timedelta

import requests

from simulator import scenarios
from simulator.spec import build_fleet, spec_from_dict
from tests.browser.conftest import browser, chromium_path, page, screenshot  # noqa: F401  (fixtures)
from tests.demo.process import demo_running

BROKEN_KINDS = ("broken-cel", "unknown-attribute", "impossible-memory")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def static_1g_slices() -> int:
    """The 1g.10gb devices of the all-1g pool: all the 1g capacity there is, since the DynamicMIG node's GPUs
    are taken whole by the h100-sweep job on Friday."""
    pools = [p["name"] for p in scenarios.MONDAY_FLEET["pools"] if p.get("layout") == "all-1g"]
    fleet = build_fleet(spec_from_dict({**scenarios.MONDAY_FLEET, "seed": 0}))
    return sum(
        1
        for s in fleet.slices
        if any(s["spec"].get("nodeName", "").startswith(pool) for pool in pools)
        for d in s["spec"].get("devices", [])
        if d["attributes"].get("profile", {}).get("string") == "1g.10gb"
    )


def still_pending_on_monday(shift: timedelta) -> dict[tuple[str, str], datetime]:
    """From the scenario's definitions: the workloads that still wait at Monday 09:00 and since when
    (shifted as the demo anchored the weekend). The pretraining jobs hold every B200/B300 for 90 h, so every
    >= 150Gi finetune waits; nothing of the 1g inference finishes, so the 1g pods after the pool's capacity
    wait; the broken claims never fit."""
    workloads = scenarios.monday_workloads(0, shift)
    chat = sorted((w for w in workloads if w.name.startswith("chat-1g-")), key=lambda w: (w.arrival, w.name))
    waiting = [w for w in workloads if w.name.startswith("finetune-") or w.kind in BROKEN_KINDS]
    waiting += chat[static_1g_slices() :]
    return {(w.namespace, w.name): w.arrival.replace(microsecond=0) for w in waiting}


def workload_of(row: dict, expected: dict) -> tuple[str, str] | None:
    """The workload a claim belongs to: claims are named ``<workload>-<pod>-<template>-<suffix>``."""
    found = [key for key in expected if key[0] == row["namespace"] and row["name"].startswith(key[1] + "-")]
    assert len(found) <= 1, (row, found)
    return found[0] if found else None


def parse_age(text: str) -> timedelta:
    """The pending page's ages: ``3d 4h``, ``5h 12m``, ``7m``."""
    units = {"d": "days", "h": "hours", "m": "minutes"}
    parts = re.fullmatch(r"(\d+)([dhm])(?: (\d+)([hm]))?", text)
    assert parts, f"unexpected age {text!r}"
    age = timedelta(**{units[parts[2]]: int(parts[1])})
    if parts[3]:
        age += timedelta(**{units[parts[4]]: int(parts[3])})
    return age


def test_make_demo_serves_a_live_fleet(tmp_path, page):  # noqa: F811  (the browser fixture)
    port = free_port()
    with demo_running(tmp_path, ["make", "--no-print-directory", "demo", f"PORT={port}"], "make demo"):
        base = f"http://127.0.0.1:{port}"

        def login_line():
            text = (tmp_path / "demo.log").read_text()
            return re.search(r"claimscope demo: (\S+)\s+login: (\S+) / (\S+)", text)

        match = wait_for(login_line, 120, "the demo to print its URL and login")
        assert match.group(1) == base + "/"
        user, password = match.group(2), match.group(3)

        def login_page():
            try:
                return requests.get(base + "/accounts/login/", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_for(login_page, 30, "the login page")
        session = requests.Session()
        form = session.get(base + "/accounts/login/", timeout=5)
        found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
        assert found, form.text[:500]
        token = found.group(1)
        response = session.post(
            base + "/accounts/login/",
            data={"username": user, "password": password, "csrfmiddlewaretoken": token},
            headers={"Referer": base + "/accounts/login/"},
            timeout=5,
        )
        assert response.status_code == 200 and "Physical GPUs and devices" in response.text
        counted = re.search(r"(\d+) devices", response.text)
        assert counted and int(counted.group(1)) > 100
        assert "B200" in response.text and "1g.10gb" in response.text

        # The weekend ended at start-up: the printed triage link names its window (the scenario's Friday
        # 18:00 on) by its real days, and links exactly that window.
        text = (tmp_path / "demo.log").read_text()
        link = re.search(
            r"triage of the 63 h replayed before start-up \(.*\), (.*) to (.*) UTC: "
            r"(\S+/claims/triage/\?since=(\S+)&until=(\S+))",
            text,
        )
        assert link, text[-2000:]
        assert link.group(3).startswith(base + "/claims/triage/?since=")
        since = datetime.fromisoformat(link.group(4).replace("Z", "+00:00"))
        until = datetime.fromisoformat(link.group(5).replace("Z", "+00:00"))
        assert link.group(1) == since.strftime("%a %Y-%m-%d %H:%M"), link.group(0)
        assert link.group(2) == until.strftime("%a %Y-%m-%d %H:%M"), link.group(0)
        shift = since - (scenarios.FRIDAY_17 + timedelta(hours=1))
        monday = scenarios.MONDAY_09 + shift
        started = datetime.now(UTC)
        assert timedelta(0) <= started - monday < timedelta(minutes=5), (monday, started)
        assert until == monday

        expected = still_pending_on_monday(shift)
        assert len(expected) == 9 + 5 + 3  # the story the scenario tells, as a sanity check of the above
        api = session.get(
            base + "/api/v1/triage/", params={"since": link.group(4), "until": link.group(5)}, timeout=30
        )
        assert api.status_code == 200, api.text[:500]
        report = api.json()
        weekend = {}
        for row in report["pended"]:
            key = workload_of(row, expected)
            if key is not None and row["outcome"] == "pending":
                weekend[key] = row
        assert set(weekend) == set(expected)
        for key, row in weekend.items():
            pending_since = datetime.fromisoformat(row["pending_since"].replace("Z", "+00:00"))
            assert pending_since == expected[key], (key, row)
            # Pending from its arrival over the weekend until now (not since the demo started).
            assert row["seconds"] >= (monday - expected[key]).total_seconds(), (key, row)
        assert report["totals"]["leaks"] >= 1  # the notebook claim left allocated on Friday night
        assert any(series["time"] for series in report["allocation"]), "no allocation samples of the weekend"
        triage_html = session.get(base + link.group(3)[len(base) :], timeout=30)
        assert triage_html.status_code == 200
        assert "finetune-0-" in triage_html.text and "chat-1g-" in triage_html.text

        # Pending ages are the weekend's hours and days (not months since a fixed date).
        pending = session.get(base + "/claims/pending/", timeout=30)
        assert pending.status_code == 200
        ages = [parse_age(a) for a in re.findall(r'<td class="age"><time [^>]*>([^<]+)</time>', pending.text)]
        assert len(ages) >= len(expected), pending.text[:1000]
        oldest = min(expected.values())  # the weekend's first waiter (Friday evening): the oldest age
        assert monday - oldest - timedelta(hours=1) <= max(ages) <= datetime.now(UTC) - oldest, ages
        # The streams resumed from the replay's cursors: no relist (which would observe the weekend anew).
        assert "demo/ResourceClaim: listed" not in (tmp_path / "demo.log").read_text()

        # The live week runs on the real clock: no claim, weekend or live, is created in the future.
        claims = session.get(
            base + "/api/v1/claims/", params={"ordering": "-id", "page_size": "200"}, timeout=30
        )
        assert claims.status_code == 200, claims.text[:500]
        created = [
            datetime.fromisoformat(c["created_at"].replace("Z", "+00:00")) for c in claims.json()["results"]
        ]
        assert created and max(created) <= datetime.now(UTC) + timedelta(seconds=5), max(created)

        # As a user sees them (the screenshots are for people; the assertions above are the test).
        page.context.add_cookies(
            [{"name": c.name, "value": c.value, "url": base} for c in session.cookies if c.value]
        )
        page.goto(base + "/claims/pending/")
        assert page.locator("td.age").count() >= len(expected)
        screenshot(page, "demo-pending")
        page.goto(link.group(3))
        page.wait_for_load_state("networkidle")
        screenshot(page, "demo-triage")
        assert page.console_errors == []
