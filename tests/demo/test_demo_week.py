"""`python manage.py demo` after start-up: the live week behaves like a week, observed through the pages.

Run ten times faster than the default (``--speed 600``) so that the weekend's 90 h pretraining jobs end
within minutes: the claims that waited over the weekend then get devices, the allocation history goes on being
sampled every minute (the production beat schedule, in the demo's process), and the chart's latest point is
the overview table's count."""

import re
import sys
from datetime import datetime

import requests

from simulator import scenarios
from tests.demo.process import demo_running
from tests.demo.test_make_demo import free_port, still_pending_on_monday, wait_for, workload_of

SPEED = 600


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def login(base: str, user: str, password: str) -> requests.Session:
    session = requests.Session()
    form = session.get(base + "/accounts/login/", timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    assert token, form.text[:500]
    response = session.post(
        base + "/accounts/login/",
        data={"username": user, "password": password, "csrfmiddlewaretoken": token.group(1)},
        headers={"Referer": base + "/accounts/login/"},
        timeout=10,
    )
    assert response.status_code == 200 and "Physical GPUs and devices" in response.text, response.text[:500]
    return session


def overview_slices(session: requests.Session, base: str) -> dict[str, tuple[int, int]]:
    """The overview table's allocated / total compute slices per model."""
    html = session.get(base + "/", timeout=30).text
    table = html.split("Physical GPUs and devices")[1].split("</table>")[0]
    rows = re.findall(r'<tr data-model="(\w+)">(?:(?!</tr>).)*?(\d+) / (\d+)', table, re.S)
    assert rows, html[:2000]
    return {model: (int(a), int(t)) for model, a, t in rows}


def test_the_live_week_places_waiting_claims_and_keeps_sampling_the_history(tmp_path):
    port = free_port()
    command = [sys.executable, "manage.py", "demo", "--port", str(port), "--speed", str(SPEED)]
    with demo_running(tmp_path, command, "the demo"):
        base = f"http://127.0.0.1:{port}"

        def started():
            text = (tmp_path / "demo.log").read_text()
            login_line = re.search(r"claimscope demo: \S+\s+login: (\S+) / (\S+)", text)
            link = re.search(r"claims/triage/\?since=(\S+)&until=(\S+)", text)
            return login_line and link and (login_line, link)

        login_line, link = wait_for(started, 120, "the demo to print its URL, login and triage link")

        def serving():
            try:
                return requests.get(base + "/accounts/login/", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_for(serving, 30, "the login page")
        session = login(base, login_line.group(1), login_line.group(2))
        since, start = link.group(1), parse(link.group(2))
        expected = still_pending_on_monday(start - scenarios.MONDAY_09)

        def triage() -> dict:
            response = session.get(base + "/api/v1/triage/", params={"since": since}, timeout=60)
            assert response.status_code == 200, response.text[:500]
            return response.json()

        # A claim that waited over the weekend is allocated during the live week, after waiting from its
        # weekend arrival until after start-up.
        def weekend_waiter_allocated():
            for row in triage()["pended"]:
                key = workload_of(row, expected)
                if key and row["outcome"] == "allocated" and parse(row["pending_until"]) > start:
                    return row, key
            return None

        row, key = wait_for(weekend_waiter_allocated, 420, "a claim pending at start-up to be allocated")
        assert row["seconds"] > (start - expected[key]).total_seconds(), row

        # The history goes on after start-up, and its latest point per model is what the overview counts
        # (read while the overview did not change around it).
        def chart_matches_table():
            before = overview_slices(session, base)
            latest = {
                s["model"]: (s["time"][-1], round(s["allocated"][-1]), round(s["total"][-1]))
                for s in triage()["allocation"]
            }
            after = overview_slices(session, base)
            fresh = all(parse(t) > start for t, _, _ in latest.values())
            chart = {model: (a, t) for model, (_, a, t) in latest.items()}
            return fresh and before == after == chart and before

        table = wait_for(chart_matches_table, 240, "history samples after start-up agreeing with the table")
        assert set(table) >= {"B200", "B300", "H100", "H200"}, table
        samples_after_start = {t for s in triage()["allocation"] for t in s["time"] if parse(t) > start}
        assert len(samples_after_start) >= 2, samples_after_start  # sampled repeatedly, not once
