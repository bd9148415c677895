"""Per-user API tokens: created and revoked on the token page (and in the admin)."""

from __future__ import annotations

from rest_framework.authtoken.models import Token


def test_a_user_creates_replaces_and_revokes_their_token(client, user):
    client.force_login(user)
    page = client.get("/api/tokens/")
    assert page.status_code == 200 and "no API token" in page.content.decode()
    client.post("/api/tokens/", {"action": "create"})
    first = Token.objects.get(user=user).key
    assert first in client.get("/api/tokens/").content.decode()
    client.post("/api/tokens/", {"action": "create"})
    second = Token.objects.get(user=user).key
    assert second != first
    assert client.get("/api/v1/clusters/", HTTP_AUTHORIZATION=f"Token {first}").status_code == 401
    assert client.get("/api/v1/clusters/", HTTP_AUTHORIZATION=f"Token {second}").status_code == 200
    client.post("/api/tokens/", {"action": "revoke"})
    assert not Token.objects.filter(user=user).exists()
    assert client.get("/api/v1/clusters/", HTTP_AUTHORIZATION=f"Token {second}").status_code == 401


def test_the_token_page_needs_a_login_and_a_known_action(client, user):
    assert client.get("/api/tokens/").status_code == 302
    client.force_login(user)
    assert client.post("/api/tokens/", {"action": "steal"}).status_code == 400


def test_staff_manage_tokens_in_the_admin(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", password="correct horse battery staple")
    client.force_login(admin)
    assert client.get("/admin/authtoken/tokenproxy/").status_code == 200
