"""Login failures and permission denials are logged with who and from where; logins are rate-limited."""

import logging

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

PASSWORD = "correct horse battery staple"
SECURITY_LOGGER = "claimscope.security"

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice", password=PASSWORD)


def login(client: Client, username: str, password: str, ip: str = "203.0.113.7"):
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=ip)


def security_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == SECURITY_LOGGER]


def test_a_failed_login_is_logged_with_the_username_and_address(client, alice, caplog):
    caplog.set_level(logging.WARNING, logger=SECURITY_LOGGER)
    response = login(client, "alice", "wrong password")
    assert response.status_code == 200  # the form again, with its error
    assert security_messages(caplog) == [
        "login failed: username='alice' ip=203.0.113.7 path=/accounts/login/"
    ]
    assert PASSWORD not in caplog.text and "wrong password" not in caplog.text


def test_five_failures_lock_the_username_out_from_that_address_even_with_the_right_password(
    client, alice, caplog, settings
):
    caplog.set_level(logging.WARNING, logger=SECURITY_LOGGER)
    for _ in range(settings.AXES_FAILURE_LIMIT):
        login(client, "alice", "wrong password")
    response = login(client, "alice", PASSWORD)
    assert response.status_code == 429
    assert b"Too many failed logins" in response.content
    assert "_auth_user_id" not in client.session
    assert security_messages(caplog)[-1].endswith("(locked out: too many failures)")


def test_a_lockout_is_per_address_so_the_user_can_still_log_in_from_elsewhere(client, alice, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT):
        login(client, "alice", "wrong password", ip="203.0.113.7")
    assert login(client, "alice", PASSWORD, ip="203.0.113.7").status_code == 429
    response = login(client, "alice", PASSWORD, ip="198.51.100.20")
    assert response.status_code == 302
    assert client.session["_auth_user_id"] == str(alice.pk)


def test_a_success_before_the_limit_resets_the_failure_count(client, alice, settings):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        login(client, "alice", "wrong password")
    assert login(client, "alice", PASSWORD).status_code == 302
    client.logout()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        login(client, "alice", "wrong password")
    assert login(client, "alice", PASSWORD).status_code == 302


def test_a_csrf_rejection_is_logged_as_a_permission_denial_with_the_user(alice, caplog):
    caplog.set_level(logging.WARNING, logger=SECURITY_LOGGER)
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post("/accounts/logout/", REMOTE_ADDR="203.0.113.9")
    assert response.status_code == 403
    assert security_messages(caplog) == [
        "permission denied: user='alice' ip=203.0.113.9 POST /accounts/logout/"
    ]


def test_a_permission_denied_view_answers_with_our_page_and_is_logged(client, alice, caplog, settings):
    settings.ROOT_URLCONF = "tests.deploy.denial_urls"
    caplog.set_level(logging.WARNING, logger=SECURITY_LOGGER)
    client.force_login(alice)
    response = client.get("/staff-only/?x=1", REMOTE_ADDR="203.0.113.10")
    assert response.status_code == 403
    assert b"ask an administrator for access" in response.content
    assert security_messages(caplog) == [
        "permission denied: user='alice' ip=203.0.113.10 GET /staff-only/?x=1"
    ]


def test_an_api_permission_denial_is_logged(client, alice, caplog, settings):
    settings.ROOT_URLCONF = "tests.deploy.denial_urls"
    caplog.set_level(logging.WARNING, logger=SECURITY_LOGGER)
    client.force_login(alice)
    response = client.get("/api/report/", REMOTE_ADDR="203.0.113.11")
    assert response.status_code == 403
    assert "secret" not in response.json()
    assert security_messages(caplog) == ["permission denied: user='alice' ip=203.0.113.11 GET /api/report/"]


def test_the_test_client_login_still_works_without_a_request(client, alice):
    # Django's Client.login() authenticates without a request: the rate limiter must stand aside.
    assert client.login(username="alice", password=PASSWORD)
