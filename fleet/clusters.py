"""Which clusters the watchers mirror, from the environment.

``CLAIMSCOPE_CLUSTERS`` is a comma-separated list of ``name=source``:

- ``name=kubeconfig:/path/to/kubeconfig`` (the file's current context),
- ``name=kubeconfig:/path/to/kubeconfig#context`` (a named context),
- ``name=incluster`` (the pod's service account).

Example: ``CLAIMSCOPE_CLUSTERS="prod=kubeconfig:/etc/kube/config#prod,lab=kubeconfig:/etc/kube/config#lab"``.
Names are slugs (they name the Cluster row). A bad entry raises :class:`ClusterConfigError` naming it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from fleet.kube.kubesource import KubeSource

ENV = "CLAIMSCOPE_CLUSTERS"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class ClusterConfigError(ValueError):
    """CLAIMSCOPE_CLUSTERS (or a --cluster argument) names something we cannot use."""


@dataclass(frozen=True)
class ClusterConfig:
    """One cluster to watch: its name and how to reach its API server."""

    name: str
    mode: str  # "kubeconfig" or "incluster"
    kubeconfig: str = ""
    context: str = ""

    def source(self) -> KubeSource:
        if self.mode == "incluster":
            return KubeSource.in_cluster()
        return KubeSource.from_kubeconfig(self.kubeconfig, self.context or None)

    def describe(self) -> str:
        if self.mode == "incluster":
            return "in-cluster service account"
        return f"kubeconfig {self.kubeconfig}" + (f" context {self.context}" if self.context else "")


def parse(value: str) -> list[ClusterConfig]:
    """Parse a CLAIMSCOPE_CLUSTERS value; an empty value means no clusters."""
    out: list[ClusterConfig] = []
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, sep, spec = entry.partition("=")
        name, spec = name.strip(), spec.strip()
        if not sep or not name or not spec:
            raise ClusterConfigError(f"{ENV}: {entry!r} is not name=source")
        if not _NAME.match(name):
            raise ClusterConfigError(f"{ENV}: cluster name {name!r} must be a lowercase DNS label")
        if any(c.name == name for c in out):
            raise ClusterConfigError(f"{ENV}: cluster {name!r} is listed twice")
        out.append(_source(name, spec))
    return out


def _source(name: str, spec: str) -> ClusterConfig:
    if spec == "incluster":
        return ClusterConfig(name, "incluster")
    if spec.startswith("kubeconfig:"):
        path, _, context = spec[len("kubeconfig:") :].partition("#")
        if not path:
            raise ClusterConfigError(f"{ENV}: cluster {name!r}: kubeconfig path missing")
        return ClusterConfig(name, "kubeconfig", os.path.expanduser(path), context)
    raise ClusterConfigError(
        f"{ENV}: cluster {name!r}: unknown source {spec!r} (use kubeconfig:/path[#context] or incluster)"
    )


def configured(env: Mapping[str, str] | None = None) -> list[ClusterConfig]:
    return parse((env if env is not None else os.environ).get(ENV, ""))


def select(name: str | None, env: Mapping[str, str] | None = None) -> list[ClusterConfig]:
    """All configured clusters, or the one named; an unknown name is a ClusterConfigError."""
    clusters = configured(env)
    if name is None:
        return clusters
    chosen = [c for c in clusters if c.name == name]
    if not chosen:
        known = ", ".join(c.name for c in clusters) or f"none: set {ENV}"
        raise ClusterConfigError(f"unknown cluster {name!r} (configured: {known})")
    return chosen


def get(name: str, env: Mapping[str, str] | None = None) -> ClusterConfig:
    return select(name, env)[0]
