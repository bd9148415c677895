"""python manage.py explain (NAMESPACE/NAME | FILE) [--cluster C | --fleet FILE ... | --kubeconfig FILE
[--context C]] [--json]

Why is this claim (or pod) pending, or: would this claim/template fit? With ``--fleet`` it runs offline on
``kubectl get resourceslices,deviceclasses,resourceclaims,pods -A -o yaml`` output; with ``--kubeconfig`` it
lists the fleet straight from that cluster's API server (no database); otherwise it reads the fleet mirrored
in the database.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from claims.diagnosis import Diagnosis, diagnose, diagnose_name
from claims.fleetstate import FleetState
from fleet.kube.kubesource import RESOURCES, KubeConfigError, KubeSource
from fleet.kube.source import SourceError
from fleet.snapshot import SnapshotError, read_files

DIAGNOSABLE = ("ResourceClaim", "ResourceClaimTemplate", "Pod")


class Command(BaseCommand):
    help = "Explain why a ResourceClaim or Pod is pending, or whether a claim/template file would fit."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "target", help="NAMESPACE/NAME of a claim or pod, or a claim/template YAML/JSON file"
        )
        parser.add_argument("--cluster", default="", help="cluster name in the database")
        parser.add_argument(
            "--fleet", nargs="+", default=[], metavar="FILE", help="kubectl get ... -o yaml output (offline)"
        )
        parser.add_argument(
            "--kubeconfig",
            default="",
            metavar="FILE",
            help="read the fleet live from this cluster (no database)",
        )
        parser.add_argument("--context", default="", help="kubeconfig context (default: the current one)")
        parser.add_argument("--json", action="store_true", help="print the result object as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["kubeconfig"]:
            if options["fleet"] or options["cluster"]:
                raise CommandError(
                    "--kubeconfig reads the fleet from the cluster: drop --fleet and --cluster"
                )
            state = live_state(options["kubeconfig"], options["context"])
        elif options["context"]:
            raise CommandError("--context needs --kubeconfig")
        else:
            state = self._state(options["fleet"], options["cluster"], options["target"])
        target: str = options["target"]
        result = self._diagnose(state, target)
        if options["json"]:
            self.stdout.write(json.dumps(result.as_dict(), indent=2, default=str))
        else:
            self.stdout.write(render(result))

    def _state(self, fleet: list[str], cluster: str, target: str) -> FleetState:
        if fleet:
            try:
                return FleetState.from_files([Path(f) for f in fleet])
            except SnapshotError as exc:
                raise CommandError(str(exc)) from None
        # Lean, as the what-if page loads it (a whole XL fleet is ~10 GB), with the claim or pod to explain
        # and that pod's claims kept whole.
        namespace, sep, name = target.partition("/")
        named = (namespace, name) if sep and not _is_file(target) else None
        try:
            return FleetState.from_db(cluster or None, lean=True, target=named)
        except LookupError as exc:
            raise CommandError(f"{exc.args[0]} (or pass --fleet FILE to run offline)") from None

    def _diagnose(self, state: FleetState, target: str) -> Diagnosis:
        path = Path(target)
        if _is_file(target):
            try:
                objs = read_files([path])
            except SnapshotError as exc:
                raise CommandError(str(exc)) from None
            found = [o for o in objs if o.get("kind") in DIAGNOSABLE]
            if not found:
                raise CommandError(f"{target}: no {', '.join(DIAGNOSABLE)} in the file")
            return diagnose(state, found[0])
        namespace, sep, name = target.partition("/")
        if not sep or not namespace or not name:
            raise CommandError(f"{target!r} is neither NAMESPACE/NAME nor an existing file")
        try:
            return diagnose_name(state, namespace, name)
        except LookupError as exc:
            raise CommandError(str(exc.args[0])) from None


def _is_file(target: str) -> bool:
    path = Path(target)
    return path.suffix.lower() in (".yaml", ".yml", ".json") or path.exists()


OPTIONAL_KINDS = frozenset({"DeviceTaintRule"})


def live_state(kubeconfig: str, context: str) -> FleetState:
    """The fleet as the API server of ``kubeconfig`` lists it now (every kind the watchers read).
    Raises CommandError naming the kubeconfig or the request that failed."""
    try:
        source = KubeSource.from_kubeconfig(kubeconfig, context or None)
    except KubeConfigError as exc:
        raise CommandError(str(exc)) from None
    objs: list[dict[str, Any]] = []
    try:
        for kind in RESOURCES:
            try:
                objs += source.list(kind)[0]
            except SourceError as exc:
                # A cluster before 1.37, or with DRADeviceTaintRules off, serves no rules: none apply.
                if kind in OPTIONAL_KINDS and str(exc).startswith("404"):
                    continue
                raise
    except SourceError as exc:
        raise CommandError(f"listing the fleet from {source.server}: {exc}") from None
    finally:
        source.close()
    return FleetState.from_objects(objs)


def render(result: Diagnosis) -> str:
    """Human-readable report: category, summary, groups per request, suggestions, lint."""
    lines = [f"[{result.category}] {result.summary}"]
    if result.placement:
        lines.append(f"  placement: node {result.placement['node']}")
        for d in result.placement["devices"]:
            lines.append(
                f"    {d['request']}: {d['pool']}/{d['device']} ({d['model']} {d['profile']})".rstrip()
            )
    for req in result.requests:
        if "groups" not in req:
            continue
        lines.append(f"  request {req['name']} (class {req['device_class']}, count {req['count']}):")
        for g in req["groups"]:
            label = f"{g['model']} {g['profile']}".strip()
            lines.append(f"    {g['devices']:>6} {label}: {g['reason']}")
        for h in req["holders"][:5]:
            pods = ", ".join(h["pods"]) or "no pod (leaked?)"
            lines.append(f"    held by {h['claim']} since {h['created'] or '?'} ({pods})")
    if result.scheduler_message:
        lines.append(f"  scheduler: {result.scheduler_message}")
    for s in result.suggestions:
        lines.append(f"  -> {s}")
    for f in result.lint:
        lines.append(f"  lint {f['severity']} {f['code']} ({f['where']}): {f['message'].splitlines()[0]}")
        if f["suggestion"]:
            lines.append(f"       {f['suggestion']}")
    return "\n".join(lines) + "\n"
