"""Per-user API tokens: stored hashed and shown once, expiring, stamped when used, revoked at once; rejected
keys are throttled per address and every step is in the audit trail."""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from fleet.models import ApiToken, AuditEvent

CLUSTERS = "/api/v1/clusters/"


def key_on(page) -> str:
    match = re.search(r'<code id="token-key">([^<]+)</code>', page.content.decode())
    assert match, page.content.decode()[:2000]
    return match.group(1)


def auth(key: str) -> dict[str, Any]:
    return {"HTTP_AUTHORIZATION": f"Token {key}"}


def test_a_new_key_is_shown_once_and_stored_only_as_a_digest(client, user):
    client.force_login(user)
    page = client.get("/api/tokens/")
    assert page.status_code == 200 and "no API token" in page.content.decode()
    created = client.post("/api/tokens/", {"action": "create"})
    key = key_on(created)
    assert "no-store" in created["Cache-Control"]
    token = ApiToken.objects.get(user=user)
    assert token.digest == hashlib.sha256(key.encode()).hexdigest() and key not in token.digest
    assert key.startswith(token.prefix) and len(key) >= 40
    with connection.cursor() as cursor:  # nowhere in the table
        cursor.execute("SELECT * FROM fleet_apitoken")
        assert key not in repr(cursor.fetchall())
    again = client.get("/api/tokens/").content.decode()
    assert key not in again and token.prefix in again
    assert client.get(CLUSTERS, **auth(key)).status_code == 200


def test_a_token_expires_after_the_configured_days(client, user, settings):
    settings.API_TOKEN_DAYS = 90
    client.force_login(user)
    key = key_on(client.post("/api/tokens/", {"action": "create"}))
    token = ApiToken.objects.get(user=user)
    assert timedelta(days=89, hours=23) < token.expires_at - timezone.now() <= timedelta(days=90)
    ApiToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    response = client.get(CLUSTERS, **auth(key))
    assert response.status_code == 401
    assert "expired" in client.get("/api/tokens/").content.decode()
    assert AuditEvent.objects.filter(
        action="token rejected", username="alice", detail__reason="expired"
    ).exists()


def test_use_is_stamped_and_audited_at_most_once_a_minute(client, user):
    client.force_login(user)
    key = key_on(client.post("/api/tokens/", {"action": "create"}))
    client.logout()
    assert ApiToken.objects.get(user=user).last_used_at is None
    for _ in range(3):
        assert client.get(CLUSTERS, **auth(key)).status_code == 200
    used = ApiToken.objects.get(user=user).last_used_at
    assert used is not None and timezone.now() - used < timedelta(minutes=1)
    assert AuditEvent.objects.filter(action="token used", username="alice").count() == 1


def test_replacing_or_revoking_stops_the_old_key_at_once(client, user):
    client.force_login(user)
    first = key_on(client.post("/api/tokens/", {"action": "create"}))
    second = key_on(client.post("/api/tokens/", {"action": "create"}))
    assert second != first
    assert client.get(CLUSTERS, **auth(first)).status_code == 401
    assert client.get(CLUSTERS, **auth(second)).status_code == 200
    client.post("/api/tokens/", {"action": "revoke"})
    assert not ApiToken.objects.filter(user=user).exists()
    assert client.get(CLUSTERS, **auth(second)).status_code == 401
    token_events = AuditEvent.objects.filter(username="alice", action__startswith="token ")
    actions = list(token_events.order_by("id").values_list("action", flat=True))
    assert actions == ["token created", "token created", "token used", "token revoked"]
    # A replaced or revoked key is unknown: rejected without a name.
    assert AuditEvent.objects.filter(action="token rejected", detail__prefix=first[:8]).exists()


def test_rejected_keys_are_throttled_per_address_and_logged(client, user, settings, caplog):
    caplog.set_level(logging.INFO, logger="claimscope.audit")
    rate = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["invalid_token"]
    limit = int(rate.split("/")[0])
    codes = [
        client.get(CLUSTERS, REMOTE_ADDR="203.0.113.9", **auth(f"guess-{n}")).status_code
        for n in range(limit + 2)
    ]
    assert codes == [401] * limit + [429, 429]
    # Throttled, even a right key from that address waits; another address is not affected.
    key = key_on(_created(client, user))
    client.logout()
    assert client.get(CLUSTERS, REMOTE_ADDR="203.0.113.9", **auth(key)).status_code == 429
    assert client.get(CLUSTERS, REMOTE_ADDR="198.51.100.1", **auth(key)).status_code == 200
    # A spoofed X-Forwarded-For does not make a fresh address (no trusted proxy is configured).
    spoofed = client.get(CLUSTERS, REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="10.1.1.1", **auth("x"))
    assert spoofed.status_code == 429
    rejected = AuditEvent.objects.filter(action="token rejected", ip="203.0.113.9")
    assert rejected.filter(detail__reason="unknown").count() == limit
    assert rejected.filter(detail__reason="throttled").exists()
    assert "token rejected: username='' ip=203.0.113.9 prefix='guess-0' reason='unknown'" in caplog.text


def _created(client, user):
    client.force_login(user)
    return client.post("/api/tokens/", {"action": "create"})


def test_the_token_page_needs_a_login_and_a_known_action(client, user):
    assert client.get("/api/tokens/").status_code == 302
    client.force_login(user)
    assert client.post("/api/tokens/", {"action": "steal"}).status_code == 400


def test_staff_see_and_revoke_tokens_in_the_admin_without_keys(client, user, django_user_model):
    key = key_on(_created(client, user))
    admin = django_user_model.objects.create_superuser("root", password="correct horse battery staple")
    client.force_login(admin)
    listing = client.get("/admin/fleet/apitoken/")
    assert listing.status_code == 200 and key not in listing.content.decode()
    token = ApiToken.objects.get(user=user)
    assert key not in client.get(f"/admin/fleet/apitoken/{token.pk}/change/").content.decode()
    assert client.get("/admin/fleet/auditevent/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_the_migration_hashes_existing_plain_tokens(django_user_model):
    """Tokens made before hashing keep working: the migration moves them to digests and drops the keys."""
    from django.core.management import call_command
    from django.test import Client

    user = django_user_model.objects.create_user("legacy", password="correct horse battery staple")
    call_command("migrate", "fleet", "0002", verbosity=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE TABLE IF NOT EXISTS authtoken_token "
                "(key varchar(40) PRIMARY KEY, created timestamp with time zone NOT NULL, user_id integer)"
            )
            cursor.execute(
                "INSERT INTO authtoken_token (key, created, user_id) VALUES (%s, %s, %s)",
                ["0123456789abcdef0123456789abcdef01234567", timezone.now(), user.pk],
            )
        call_command("migrate", verbosity=0)  # every app: claims' migrations after fleet 0002 were undone too
        client = Client()
        assert client.get(CLUSTERS, **auth("0123456789abcdef0123456789abcdef01234567")).status_code == 200
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM authtoken_token")
            assert cursor.fetchone()[0] == 0
    finally:
        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS authtoken_token")
