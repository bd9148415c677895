"""The audit trail: logins and their failures, logouts and exports land in one table (fleet.AuditEvent, read
in the admin) and on the ``claimscope.audit`` logger, with the user and the client address."""

from __future__ import annotations

import logging

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client

from fleet.access.visibility import grant_all_namespaces
from fleet.api.tokens import create_token
from fleet.models import AuditEvent

PASSWORD = "correct horse battery staple"
IP = "203.0.113.20"


@pytest.fixture(autouse=True)
def _fresh_throttles():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def alice():
    user = get_user_model().objects.create_user("alice", password=PASSWORD)
    grant_all_namespaces(user)
    return user


def events(**filters) -> list[tuple[str, str, str]]:
    rows = AuditEvent.objects.filter(**filters).order_by("id")
    return [(e.action, e.username, e.ip) for e in rows]


def login(client: Client, password: str):
    return client.post("/accounts/login/", {"username": "alice", "password": password}, REMOTE_ADDR=IP)


def test_logins_failures_lockouts_and_logouts_are_recorded_and_logged(alice, settings, caplog):
    caplog.set_level(logging.INFO, logger="claimscope.audit")
    client = Client()
    login(client, "wrong")
    assert login(client, PASSWORD).status_code == 302
    client.post("/accounts/logout/", REMOTE_ADDR=IP)
    assert events() == [
        ("login failed", "alice", IP),
        ("login", "alice", IP),
        ("logout", "alice", IP),
    ]
    for _ in range(settings.AXES_FAILURE_LIMIT):
        login(client, "wrong")
    assert login(client, PASSWORD).status_code == 429
    last = AuditEvent.objects.order_by("-id").first()
    assert last is not None and last.action == "login failed" and last.detail == {"locked_out": True}
    assert f"login: username='alice' ip={IP} backend=" in caplog.text
    assert PASSWORD not in caplog.text


@pytest.mark.usefixtures("fleet")
def test_csv_and_token_reads_are_exports_and_page_calls_are_not(alice):
    session = Client()
    session.force_login(alice)
    AuditEvent.objects.all().delete()
    assert session.get("/api/v1/claims/", REMOTE_ADDR=IP).status_code == 200  # the pages' own calls
    assert events(action="export") == []
    assert session.get("/api/v1/claims/?format=csv", REMOTE_ADDR=IP).status_code == 200
    triage = session.get("/api/v1/triage/?format=csv&section=pended", REMOTE_ADDR=IP)
    assert triage.status_code == 200
    key = create_token(alice)
    script = Client()
    assert script.get("/api/v1/nodes/", REMOTE_ADDR=IP, HTTP_AUTHORIZATION=f"Token {key}").status_code == 200
    exports = list(AuditEvent.objects.filter(action="export").order_by("id"))
    assert [(e.username, e.ip, e.detail["format"], e.detail["via"]) for e in exports] == [
        ("alice", IP, "csv", "session"),
        ("alice", IP, "csv", "session"),
        ("alice", IP, "json", "token"),
    ]
    assert [e.detail["path"] for e in exports] == [
        "/api/v1/claims/?format=csv",
        "/api/v1/triage/?format=csv&section=pended",
        "/api/v1/nodes/",
    ]
    # A refused request exports nothing.
    assert Client().get("/api/v1/nodes/?format=csv").status_code == 401
    assert AuditEvent.objects.filter(action="export").count() == 3
