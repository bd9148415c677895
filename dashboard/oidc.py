"""Optional single sign-on with OpenID Connect (mozilla-django-oidc, authorization-code flow with PKCE).

Off unless ``CLAIMSCOPE_OIDC_CLIENT_ID`` is set (settings: :mod:`dashboard.oidc_config`). See
docs/operations.md, "Single sign-on".

What this adds to the library, and why:

- users are matched by the ID token's ``sub`` (username ``oidc-<sub>``), never by e-mail address: the
  library's default e-mail matching would let anyone whose issuer account carries an admin's address log in
  as that local admin;
- the ID token's ``iss`` and ``aud`` are checked (the library verifies only the signature, the expiry and the
  nonce);
- a token that fails verification is a failed login (logged on ``claimscope.security``), not a 400;
- new users get no namespace (``fleet.access.visibility``: secure by default). With
  ``CLAIMSCOPE_OIDC_NAMESPACES_CLAIM`` set, the namespaces listed in that claim become the user's grants at
  every login, replacing the previous ones (the issuer then owns SSO users' grants).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from typing import Any

import requests
from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.http import HttpRequest
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from fleet.access.grants import sync_grants, sync_kube_identity

log = logging.getLogger("claimscope.security")

USERNAME_PREFIX = "oidc-"
_SAFE_SUB = re.compile(r"^[\w.@+-]{1,100}$", re.ASCII)
_NAMESPACE = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")


def username_for(subject: str) -> str:
    """The local username of the issuer's subject: ``oidc-<sub>``, or a digest when ``sub`` has characters
    Django usernames refuse (or is long). Local accounts never start with the prefix by this rule alone:
    admins should not create such names by hand."""
    if _SAFE_SUB.match(subject):
        return USERNAME_PREFIX + subject
    return USERNAME_PREFIX + hashlib.sha256(subject.encode()).hexdigest()[:40]


def namespaces_from_claim(value: Any) -> list[tuple[str | None, str]]:
    """``(cluster or None, namespace)`` pairs from a claim value: a list (or space/comma-separated string) of
    ``namespace`` or ``cluster/namespace``; anything else is ignored."""
    items = value.replace(",", " ").split() if isinstance(value, str) else value
    if not isinstance(items, list):
        return []
    out = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            continue
        cluster, _, namespace = item.strip().rpartition("/")
        if _NAMESPACE.match(namespace):
            out.append((cluster or None, namespace))
    return out


class ClaimscopeOIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend, matching users by subject and checking issuer and audience."""

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        try:
            return super().authenticate(request, **kwargs)
        except (SuspiciousOperation, requests.RequestException) as exc:
            # A forged or mis-signed token, a replayed nonce, an unreachable issuer: a failed login.
            log.warning(
                "SSO login failed: %s ip=%s",
                exc,
                request.META.get("REMOTE_ADDR", "-") if request is not None else "-",
            )
            return None

    def verify_token(self, token: str, **kwargs: Any) -> Any:
        payload = super().verify_token(token, **kwargs)  # signature (JWKS), expiry, nonce
        if payload.get("iss") != settings.CLAIMSCOPE_OIDC_ISSUER:
            raise SuspiciousOperation(f"ID token issuer {payload.get('iss')!r} is not the configured one")
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self.OIDC_RP_CLIENT_ID not in audiences:
            raise SuspiciousOperation("ID token audience does not include this client")
        if not payload.get("sub"):
            raise SuspiciousOperation("ID token has no subject")
        return payload

    def get_userinfo(self, access_token: str, id_token: str, payload: Mapping[str, Any]) -> Any:
        claims = dict(super().get_userinfo(access_token, id_token, payload))
        # The userinfo answer must describe the same subject as the verified ID token (OIDC Core 5.3.2).
        if str(claims.get("sub", "")) != str(payload.get("sub")):
            raise SuspiciousOperation("userinfo subject differs from the ID token's")
        return claims

    def verify_claims(self, claims: Mapping[str, Any]) -> bool:
        return bool(claims.get("sub"))

    def filter_users_by_claims(self, claims: Mapping[str, Any]) -> Any:
        return self.UserModel.objects.filter(username=username_for(str(claims["sub"])))

    def create_user(self, claims: Mapping[str, Any]) -> Any:
        with transaction.atomic():
            user = self.UserModel.objects.create_user(username_for(str(claims["sub"])))  # no usable password
            return self.update_user(user, claims)

    def update_user(self, user: Any, claims: Mapping[str, Any]) -> Any:
        user.email = str(claims.get("email") or "")[:254]
        user.first_name = str(claims.get("given_name") or claims.get("name") or "")[:150]
        user.last_name = str(claims.get("family_name") or "")[:150]
        user.save(update_fields=["email", "first_name", "last_name"])
        claim = settings.CLAIMSCOPE_OIDC_NAMESPACES_CLAIM
        if claim:
            sync_grants(user, namespaces_from_claim(claims.get(claim)))
        sync_kube_identity(user, claims)
        return user
