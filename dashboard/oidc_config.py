"""OIDC login settings from ``CLAIMSCOPE_OIDC_*`` variables (read by dashboard/settings.py; no Django imports:
it runs before the apps load). The login itself is :mod:`dashboard.oidc`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dashboard.env import ConfigError

PREFIX = "CLAIMSCOPE_OIDC_"
_REQUIRED = {
    "ISSUER": "the issuer URL, exactly as in the ID token's iss claim",
    "AUTHORIZATION_ENDPOINT": "the issuer's authorization endpoint URL",
    "TOKEN_ENDPOINT": "the issuer's token endpoint URL",
    "USERINFO_ENDPOINT": "the issuer's userinfo endpoint URL",
    "JWKS_ENDPOINT": "the issuer's JWKS URL (the keys ID tokens are verified with)",
    "CLIENT_SECRET": "the client secret the issuer gave claimscope",
}
_SIGN_ALGORITHMS = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512")


def oidc_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The Django settings for OIDC login from ``CLAIMSCOPE_OIDC_*`` variables (only
    ``CLAIMSCOPE_OIDC_ENABLED=False`` when it is off).
    Raises ConfigError naming the first variable that is missing or wrong."""
    client_id = env.get(PREFIX + "CLIENT_ID", "").strip()
    if not client_id:
        stray = sorted(k for k in env if k.startswith(PREFIX) and env[k].strip())
        if stray:
            raise ConfigError(
                PREFIX + "CLIENT_ID", "", f"set as well, since {stray[0]} is set (or unset both)"
            )
        return {"CLAIMSCOPE_OIDC_ENABLED": False}
    values = {}
    for name, expected in _REQUIRED.items():
        value = env.get(PREFIX + name, "").strip()
        if not value:
            raise ConfigError(PREFIX + name, "", expected)
        if name != "CLIENT_SECRET" and not value.startswith(("https://", "http://")):
            raise ConfigError(PREFIX + name, value, "an http(s) URL")
        values[name] = value
    algorithm = env.get(PREFIX + "SIGN_ALGO", "RS256").strip()
    if algorithm not in _SIGN_ALGORITHMS:
        # HS256 would verify ID tokens with the client secret: anyone holding it could mint tokens.
        raise ConfigError(PREFIX + "SIGN_ALGO", algorithm, f"one of {', '.join(_SIGN_ALGORITHMS)}")
    scopes = env.get(PREFIX + "SCOPES", "openid email profile").split()
    if "openid" not in scopes:
        raise ConfigError(PREFIX + "SCOPES", " ".join(scopes), "a scope list including openid")
    timeout = env.get(PREFIX + "TIMEOUT", "10").strip()
    if not timeout.isdigit() or int(timeout) < 1:
        raise ConfigError(PREFIX + "TIMEOUT", timeout, "a whole number of seconds, at least 1")
    return {
        "CLAIMSCOPE_OIDC_ENABLED": True,
        "CLAIMSCOPE_OIDC_ISSUER": values["ISSUER"],
        "CLAIMSCOPE_OIDC_NAMESPACES_CLAIM": env.get(PREFIX + "NAMESPACES_CLAIM", "").strip(),
        "CLAIMSCOPE_OIDC_BUTTON": env.get(PREFIX + "BUTTON", "Log in with SSO").strip() or "Log in with SSO",
        "OIDC_RP_CLIENT_ID": client_id,
        "OIDC_RP_CLIENT_SECRET": values["CLIENT_SECRET"],
        "OIDC_OP_AUTHORIZATION_ENDPOINT": values["AUTHORIZATION_ENDPOINT"],
        "OIDC_OP_TOKEN_ENDPOINT": values["TOKEN_ENDPOINT"],
        "OIDC_OP_USER_ENDPOINT": values["USERINFO_ENDPOINT"],
        "OIDC_OP_JWKS_ENDPOINT": values["JWKS_ENDPOINT"],
        "OIDC_RP_SIGN_ALGO": algorithm,
        "OIDC_RP_SCOPES": " ".join(scopes),
        "OIDC_USE_PKCE": True,
        "OIDC_TIMEOUT": int(timeout),
        "OIDC_CREATE_USER": True,
        "LOGIN_REDIRECT_URL_FAILURE": "/accounts/login/?sso=failed",
    }
