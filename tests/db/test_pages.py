"""Every page needs a login (health check aside)."""

from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fleet-small.yaml"


@pytest.fixture
def user():
    return get_user_model().objects.create_user("alice", password="correct horse battery staple")


def test_pages_redirect_anonymous_users_to_login(client):
    for path in ("/", "/admin/"):
        response = client.get(path)
        assert response.status_code == 302
        assert "login" in response["Location"]


def test_health_check_needs_no_login(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


def test_home_shows_the_fleet_summary_after_login(client, user):
    call_command("import_snapshot", str(FIXTURE), cluster="fixtures", stdout=StringIO())
    client.force_login(user)
    page = client.get("/").content.decode()
    assert "B200" in page and "3g.71gb" in page


def test_login_with_the_form(client, user):
    response = client.post(
        "/accounts/login/", {"username": "alice", "password": "correct horse battery staple"}
    )
    assert response.status_code == 302
    assert client.get("/").status_code == 200
    bad = client.post("/accounts/login/", {"username": "alice", "password": "wrong"})
    assert bad.status_code == 200 and "didn" in bad.content.decode()
