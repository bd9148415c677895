"""Which Prometheus serves each cluster's DCGM metrics, from ``CLAIMSCOPE_PROMETHEUS``.

A comma-separated list of ``cluster=URL`` entries, each optionally followed by ``;option=value`` parts:

- ``token_file=/path``: a bearer token read from the file at each round (so a rotated token is picked up);
- ``ca_file=/path``: the CA bundle that signs the server's certificate;
- ``label=name:value`` (repeatable): label matchers added to every query, for a Prometheus that holds
  several clusters (e.g. ``label=cluster:prod``);
- ``compress=yes|no``: ask for gzip-compressed answers. By default not from a Prometheus on the loopback or
  in the cluster's network (a host name without dots, ``*.svc``, ``*.cluster.local``): a round reads ~50 MB
  at 40,000 GPUs, nothing there, and inflating it costs the worker a tenth of a round's CPU; from any other
  host, yes.

Example: ``prod=https://prom.example:9090;token_file=/run/secrets/prom;label=cluster:prod,lab=http://…``.
Kept beside ``CLAIMSCOPE_CLUSTERS`` rather than inside it: the fleet's watchers do not know about
utilization. A bad entry raises :class:`PrometheusConfigError` naming it.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from urllib.parse import urlparse

ENV = "CLAIMSCOPE_PROMETHEUS"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class PrometheusConfigError(ValueError):
    """CLAIMSCOPE_PROMETHEUS has an entry we cannot use."""


@dataclass(frozen=True)
class PrometheusConfig:
    """How to query one cluster's Prometheus."""

    cluster: str
    url: str
    token_file: str = ""
    ca_file: str = ""
    labels: tuple[tuple[str, str], ...] = field(default=())
    compress: bool | None = None  # None: by where the server is (see :meth:`compressed`)

    def matchers(self) -> str:
        """The extra label matchers, PromQL-quoted (values escaped)."""
        return ",".join(f'{k}="{_escape(v)}"' for k, v in self.labels)

    def compressed(self) -> bool:
        """Whether to ask for gzip: as configured, else only from a server outside the cluster's network."""
        if self.compress is not None:
            return self.compress
        host = (urlparse(self.url).hostname or "").rstrip(".").lower()
        if host == "localhost" or "." not in host or host.endswith((".svc", ".cluster.local")):
            return False
        try:
            return not ipaddress.ip_address(host).is_loopback
        except ValueError:  # a host name
            return True


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse(value: str) -> dict[str, PrometheusConfig]:
    """Parse a CLAIMSCOPE_PROMETHEUS value into {cluster name: config}; empty means none."""
    out: dict[str, PrometheusConfig] = {}
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        head, *options = entry.split(";")
        name, sep, url = head.partition("=")
        name, url = name.strip(), url.strip()
        if not sep or not name or not url:
            raise PrometheusConfigError(f"{ENV}: {entry!r} is not cluster=URL[;option=value...]")
        if not _NAME.match(name):
            raise PrometheusConfigError(f"{ENV}: cluster name {name!r} must be a lowercase DNS label")
        if name in out:
            raise PrometheusConfigError(f"{ENV}: cluster {name!r} is listed twice")
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise PrometheusConfigError(f"{ENV}: cluster {name!r}: {url!r} is not an http(s) URL")
        token_file = ca_file = ""
        compress: bool | None = None
        labels: list[tuple[str, str]] = []
        for option in options:
            key, eq, val = option.partition("=")
            key, val = key.strip(), val.strip()
            if not eq or not val:
                raise PrometheusConfigError(f"{ENV}: cluster {name!r}: option {option!r} is not key=value")
            if key == "token_file":
                token_file = val
            elif key == "ca_file":
                ca_file = val
            elif key == "compress":
                if val not in ("yes", "no"):
                    raise PrometheusConfigError(f"{ENV}: cluster {name!r}: compress={val!r} is not yes or no")
                compress = val == "yes"
            elif key == "label":
                label, colon, lval = val.partition(":")
                if not colon or not _LABEL.match(label):
                    raise PrometheusConfigError(
                        f"{ENV}: cluster {name!r}: label {val!r} is not name:value (a Prometheus label name)"
                    )
                labels.append((label, lval))
            else:
                raise PrometheusConfigError(
                    f"{ENV}: cluster {name!r}: unknown option {key!r} (token_file, ca_file, label, compress)"
                )
        out[name] = PrometheusConfig(name, url.rstrip("/"), token_file, ca_file, tuple(labels), compress)
    return out
