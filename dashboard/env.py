"""Small typed readers for configuration from the environment.

Every reader names the variable and what was expected when the value is bad, so a misconfigured
deployment stops at start-up with a message an operator can act on, instead of failing later.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from urllib.parse import urlparse

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class ConfigError(ImproperlyConfigured):
    """A configuration variable has a value we cannot use."""

    def __init__(self, name: str, value: str, expected: str) -> None:
        super().__init__(f"{name}={value!r} is invalid: expected {expected}")
        self.name = name


def env_str(name: str, default: str = "", env: Mapping[str, str] | None = None) -> str:
    return (env if env is not None else os.environ).get(name, default)


def env_bool(name: str, default: bool = False, env: Mapping[str, str] | None = None) -> bool:
    raw = (env if env is not None else os.environ).get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(name, raw, "one of 1/0, true/false, yes/no, on/off")


def env_int(
    name: str,
    default: int,
    minimum: int | None = None,
    env: Mapping[str, str] | None = None,
    *,
    maximum: int | None = None,
) -> int:
    raw = (env if env is not None else os.environ).get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, raw, "an integer") from None
    below = minimum is not None and value < minimum
    if below or (maximum is not None and value > maximum):
        if minimum is not None and maximum is not None:
            raise ConfigError(name, raw, f"an integer from {minimum} to {maximum}")
        raise ConfigError(name, raw, f"an integer >= {minimum}" if below else f"an integer <= {maximum}")
    return value


def env_list(name: str, default: list[str], env: Mapping[str, str] | None = None) -> list[str]:
    raw = (env if env is not None else os.environ).get(name)
    if raw is None:
        return default
    return [part.strip() for part in raw.split(",") if part.strip()]


def env_networks(name: str, env: Mapping[str, str] | None = None) -> list[str]:
    """Comma-separated IP addresses or CIDR networks (``10.0.0.5``, ``10.244.0.0/16``, ``fd00::/8``); empty
    when unset. ``*`` is refused: trusting every peer's forwarded headers lets any client pick its address."""
    out = []
    for part in env_list(name, [], env):
        try:
            out.append(str(ipaddress.ip_network(part, strict=False)))
        except ValueError:
            raise ConfigError(name, part, "IP addresses or CIDR networks, comma-separated (not *)") from None
    return out


def env_url(name: str, schemes: tuple[str, ...], env: Mapping[str, str] | None = None) -> str | None:
    """Return the URL in ``name`` (None when unset or empty), checking its scheme and host."""
    raw = (env if env is not None else os.environ).get(name, "").strip()
    if not raw:
        return None
    parsed = urlparse(raw)
    if parsed.scheme not in schemes:
        raise ConfigError(
            name, _redact(raw), f"a URL starting with {' or '.join(s + '://' for s in schemes)}"
        )
    if not parsed.hostname and not parsed.path.strip("/"):
        raise ConfigError(name, _redact(raw), "a URL with a host (and, for a database, a name)")
    return raw


def _redact(url: str) -> str:
    """Hide a password in error messages: they end up in logs."""
    parsed = urlparse(url)
    if parsed.password:
        return url.replace(f":{parsed.password}@", ":***@")
    return url
