"""Claims the test issuer puts in ID tokens and userinfo: e-mail, names, and ``namespaces`` (the user's
group names), the claim CLAIMSCOPE_OIDC_NAMESPACES_CLAIM can map to namespace grants."""

from __future__ import annotations

from typing import Any

from oauth2_provider.oauth2_validators import OAuth2Validator


class Validator(OAuth2Validator):
    oidc_claim_scope = None  # every claim, whatever the scopes

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        user = request.user
        return {
            "email": user.email,
            "preferred_username": user.username,
            "given_name": user.first_name,
            "namespaces": sorted(user.groups.values_list("name", flat=True)),
        }
