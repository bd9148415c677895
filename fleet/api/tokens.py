"""API tokens: the token page (each user creates, replaces and revokes their own), and the DRF
authentication class that checks them.

A token is 256 random bits, sent as ``Authorization: Token <key>``. Only its SHA-256 digest is stored
(``fleet.models.ApiToken``), so the key is shown once, on the page that creates it. Tokens expire
(``API_TOKEN_DAYS``, default 90) and record when they were last used; revoking deletes the row, so the next
request with the key fails. Rejected keys are throttled per client address (``invalid_token`` rate) and
logged in the audit trail.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication
from rest_framework.throttling import SimpleRateThrottle

from fleet.access import audit
from fleet.models import ApiToken

PREFIX_LENGTH = 8
LAST_USED_RESOLUTION = timedelta(minutes=1)  # last_used_at (and the audit's "token used") at most this often


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def create_token(user: AbstractBaseUser) -> str:
    """A new key for ``user`` (replacing any previous one); returns the key, which is not stored."""
    key = secrets.token_urlsafe(32)
    now = timezone.now()
    user_id = int(user.pk or 0)
    ApiToken.objects.filter(user_id=user_id).delete()
    ApiToken.objects.create(
        user_id=user_id,
        digest=digest(key),
        prefix=key[:PREFIX_LENGTH],
        created_at=now,
        expires_at=now + timedelta(days=settings.API_TOKEN_DAYS),
    )
    return key


class InvalidTokenThrottle(SimpleRateThrottle):
    """Counts rejected tokens per client address (the ``invalid_token`` rate). DRF's throttles run after
    authentication, which fails first on a bad key, so :class:`ApiTokenAuthentication` consults this one
    itself: before checking a key (:meth:`blocked`) and after rejecting one (:meth:`failed`)."""

    scope = "invalid_token"
    num_requests: int  # set from the rate by SimpleRateThrottle.__init__
    duration: int

    def get_cache_key(self, request: Any, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    def blocked(self, request: Any) -> float | None:
        """Seconds to wait when this address already used up its rejected tokens, else None."""
        self.key = self.get_cache_key(request, None)
        self.history = self.cache.get(self.key, [])
        self.now = self.timer()
        while self.history and self.history[-1] <= self.now - self.duration:
            self.history.pop()
        return self.wait() if len(self.history) >= self.num_requests else None

    def failed(self, request: Any) -> None:
        self.blocked(request)
        self.history.insert(0, self.now)
        self.cache.set(self.key, self.history, self.duration)


class ApiTokenAuthentication(TokenAuthentication):
    """``Authorization: Token <key>`` against the stored digests; expired and unknown keys are refused."""

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        self._request = request
        return super().authenticate(request)

    def authenticate_credentials(self, key: str) -> tuple[Any, ApiToken]:
        request = self._request
        throttle = InvalidTokenThrottle()
        wait = throttle.blocked(request)
        if wait is not None:
            audit.record("token rejected", "", request, reason="throttled")
            raise exceptions.Throttled(wait)
        now = timezone.now()
        token = ApiToken.objects.select_related("user").filter(digest=digest(key)).first()
        reason = None
        if token is None:
            reason = "unknown"
        elif token.expires_at <= now:
            reason = "expired"
        elif not token.user.is_active:
            reason = "user inactive"
        if reason is not None or token is None:
            throttle.failed(request)
            name = token.user.get_username() if token is not None else ""
            audit.record("token rejected", name, request, reason=reason, prefix=key[:PREFIX_LENGTH])
            raise exceptions.AuthenticationFailed("Invalid or expired token.")
        if token.last_used_at is None or token.last_used_at <= now - LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
            audit.record("token used", token.user.get_username(), request, prefix=token.prefix)
        return token.user, token


@never_cache
@require_http_methods(["GET", "POST"])
def tokens_page(request: HttpRequest) -> HttpResponse:
    """GET shows the user's token (never its key); POST ``action=create`` replaces it with a new one and
    shows the key this once, ``action=revoke`` deletes it (requests with the old key fail from then on)."""
    user = request.user  # LoginRequiredMiddleware: only logged-in users get here
    user_id = int(user.pk or 0)
    name = user.get_username()
    context: dict[str, Any] = {}
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "create":
            context["key"] = create_token(user)  # type: ignore[arg-type]
            audit.record("token created", name, request, days=settings.API_TOKEN_DAYS)
        elif action == "revoke":
            deleted, _ = ApiToken.objects.filter(user_id=user_id).delete()
            context["message"] = "API token revoked." if deleted else "You had no API token."
            if deleted:
                audit.record("token revoked", name, request)
        else:
            return HttpResponse("action must be create or revoke", status=400, content_type="text/plain")
    context["token"] = ApiToken.objects.filter(user_id=user_id).first()
    context["now"] = timezone.now()
    return render(request, "api/tokens.html", context)
