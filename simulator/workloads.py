"""Workloads over simulated time: pods with DRA claims arrive, get scheduled (by an injected `Schedule`),
run, finish, or stay pending and retry. Every step is a write to a `SimulatedCluster`, so watchers see the
same ADDED/MODIFIED/DELETED stream a real cluster would produce.

Deterministic: arrival jitter and workload mix come from a seeded `random.Random`; timestamps come from the
simulated clock, never from the wall clock.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from simulator import nvidia as nv
from simulator.cluster import SimulatedCluster
from simulator.scheduling import Decision, Schedule
from simulator.spec import Fleet

Obj = dict[str, Any]

GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"


def ts(t: datetime) -> str:
    """RFC 3339 timestamp as the API server writes it (seconds, Z)."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_ts(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


@dataclass(frozen=True)
class Workload:
    """One job: `pods` pods, each with one claim from template `template` (created on first use).

    `duration` None = runs past the end of the simulation. `kind` is descriptive (training, gang, inference,
    broken-cel, unknown-attribute, impossible-memory, …) and ends up as a pod label.
    """

    namespace: str
    name: str
    kind: str
    arrival: datetime
    requests: tuple[Obj, ...]
    constraints: tuple[Obj, ...] = ()
    pods: int = 1
    duration: timedelta | None = None
    template: str | None = None

    @property
    def template_name(self) -> str:
        return self.template or f"{self.name}-claim"


# ---- request builders used by scenarios and the random generator -------------------------------------------


def memory_at_least(quantity: str) -> str:
    """The correct CEL form for "device memory >= q" (`>=` on quantities does not compile: no ordering
    overload in staging/src/k8s.io/apiserver/pkg/cel/library/quantity.go)."""
    return f"device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('{quantity}')) >= 0"


def product_is(product: str) -> str:
    return f"device.attributes['gpu.nvidia.com'].productName == '{product}'"


def profile_is(profile: str) -> str:
    return f"device.attributes['gpu.nvidia.com'].profile == '{profile}'"


def training(
    ns: str, name: str, at: datetime, gpus: int, selectors: list[str], hours: float | None
) -> Workload:
    return Workload(
        ns,
        name,
        "training",
        at,
        (nv.exactly_request("gpus", GPU_CLASS, count=gpus, selectors=selectors),),
        ({"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/productName"},),
        duration=None if hours is None else timedelta(hours=hours),
    )


def gang(
    ns: str, name: str, at: datetime, pods: int, gpus: int, product: str, hours: float | None
) -> Workload:
    return Workload(
        ns,
        name,
        "gang",
        at,
        (nv.exactly_request("gpus", GPU_CLASS, count=gpus, selectors=[product_is(product)]),),
        ({"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/productName"},),
        pods=pods,
        duration=None if hours is None else timedelta(hours=hours),
    )


def inference_mig(ns: str, name: str, at: datetime, profiles: list[str], hours: float | None) -> Workload:
    """firstAvailable over MIG profiles (smallest first), falling back to a full GPU."""
    subs = [nv.subrequest(f"p{i}", MIG_CLASS, selectors=[profile_is(p)]) for i, p in enumerate(profiles)]
    subs.append(nv.subrequest("full", GPU_CLASS))
    return Workload(
        ns,
        name,
        "inference",
        at,
        (nv.first_available_request("mig", subs),),
        duration=None if hours is None else timedelta(hours=hours),
    )


def mig_exact(
    ns: str, name: str, at: datetime, profile: str, hours: float | None, template: str | None = None
) -> Workload:
    return Workload(
        ns,
        name,
        "inference",
        at,
        (nv.exactly_request("mig", MIG_CLASS, selectors=[profile_is(profile)]),),
        duration=None if hours is None else timedelta(hours=hours),
        template=template,
    )


def broken(ns: str, name: str, at: datetime, kind: str) -> Workload:
    """Typical mistakes: a CEL runtime error, an attribute nobody publishes, impossible memory."""
    selector = {
        "broken-cel": "device.attributes['gpu.nvidia.com'].gpuMemoryGiB >= 80",
        "unknown-attribute": "device.attributes['gpu.nvidia.com'].nvlinkDomain == 'rack-7'",
        "impossible-memory": memory_at_least("400Gi"),
    }[kind]
    return Workload(ns, name, kind, at, (nv.exactly_request("gpu", GPU_CLASS, selectors=[selector]),))


# ---- the simulation loop -----------------------------------------------------------------------------------


@dataclass(order=True)
class _Action:
    at: datetime
    seq: int
    what: str = field(compare=False)
    args: tuple[Any, ...] = field(compare=False, default=())


class Simulation:
    """Drives a SimulatedCluster through time. `schedule` decides every placement (injected).

    Pending pods are retried every `retry_every` (the real scheduler retries on cluster events with backoff;
    a fixed period keeps the event stream bounded and deterministic).
    """

    def __init__(
        self,
        cluster: SimulatedCluster,
        schedule: Schedule,
        start: datetime,
        retry_every: timedelta = timedelta(minutes=30),
    ) -> None:
        self.cluster = cluster
        self.schedule = schedule
        self.now = start
        self.retry_every = retry_every
        self._queue: list[_Action] = []
        self._seq = 0
        self._pending: set[tuple[str, str]] = set()
        self._events: dict[tuple[str, str], str] = {}  # pod -> name of its FailedScheduling event
        self._templates: set[tuple[str, str]] = set()

    # -- setup --

    def load_fleet(self, fleet: Fleet) -> None:
        self.cluster.bulk_create(fleet.objects())

    def at(self, when: datetime, what: str, *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, _Action(when, self._seq, what, args))

    def submit(self, w: Workload) -> None:
        self.at(w.arrival, "arrive", w)

    def xid(self, when: datetime, node: str, gpu_minor: int, code: str = "79") -> None:
        """A fatal XID on a GPU: the driver's health check taints all of that GPU's devices (NoSchedule)."""
        self.at(when, "xid", node, gpu_minor, code)

    def node_loss(self, when: datetime, node: str) -> None:
        """A node vanishes: its Node and slices go, and its pods are deleted (their claims released)."""
        self.at(when, "node_loss", node)

    def leak(self, when: datetime, namespace: str, name: str, request: Obj, release_after: timedelta) -> None:
        """A hand-made claim used by a pod deleted later: it stays allocated, reserved by nobody."""
        self.at(when, "leak", namespace, name, request, release_after)

    def compress(self, factor: float) -> None:
        """From now on, time passes ``factor`` times faster: every queued action comes ``factor`` times
        sooner after now (a job due to end in 27 h ends in 27 h / factor) and pending pods are retried
        ``factor`` times as often. Workloads submitted afterwards are the caller's to compress.

        Precondition: ``factor`` > 0."""
        now = self.now
        for action in self._queue:
            if action.at > now:
                action.at = now + (action.at - now) / factor
        heapq.heapify(self._queue)  # order kept (a monotonic map), but heapify states the invariant
        self.retry_every = self.retry_every / factor

    # -- loop --

    def run(self, until: datetime) -> None:
        """Process every action due up to `until` (inclusive); the clock ends at `until`."""
        while self._queue and self._queue[0].at <= until:
            action = heapq.heappop(self._queue)
            self.now = action.at
            getattr(self, f"_do_{action.what}")(*action.args)
        self.now = until

    def _do_arrive(self, w: Workload) -> None:
        tkey = (w.namespace, w.template_name)
        if tkey not in self._templates:
            self._templates.add(tkey)
            self.cluster.create(
                nv.claim_template(
                    w.namespace,
                    w.template_name,
                    list(w.requests),
                    list(w.constraints) or None,
                    created=ts(self.now),
                )
            )
        for i in range(w.pods):
            pod_name = f"{w.name}-{i}"
            pod = nv.pod_object(
                w.namespace,
                pod_name,
                [("gpus", w.template_name)],
                labels={"app.kubernetes.io/name": w.name, "claimscope.io/workload-kind": w.kind},
                created=ts(self.now),
            )
            pod = self.cluster.create(pod)
            claim_name = nv.generated_claim_name(pod_name, "gpus")
            self.cluster.create(
                nv.claim_object(
                    w.namespace,
                    claim_name,
                    list(w.requests),
                    list(w.constraints) or None,
                    owner_pod=pod,
                    pod_claim_name="gpus",
                    created=ts(self.now),
                )
            )
            # The controller records the generated name in the pod status.
            status = {
                **pod["status"],
                "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": claim_name}],
            }
            self.cluster.update({**pod, "status": status})
            self._pending.add((w.namespace, pod_name))
            self.at(self.now, "schedule", w.namespace, pod_name, w.duration)

    def _claims_of(self, pod: Obj) -> list[Obj]:
        ns = pod["metadata"]["namespace"]
        names = {s["name"]: s["resourceClaimName"] for s in pod["status"].get("resourceClaimStatuses", [])}
        out = []
        for pc in pod["spec"]["resourceClaims"]:
            cname = pc.get("resourceClaimName") or names.get(pc["name"])
            claim = self.cluster.get("ResourceClaim", ns, cname) if cname else None
            if claim is not None:
                out.append(claim)
        return out

    def _do_schedule(self, ns: str, pod_name: str, duration: timedelta | None) -> None:
        pod = self.cluster.get("Pod", ns, pod_name)
        if pod is None or (ns, pod_name) not in self._pending:
            return
        claims = self._claims_of(pod)
        decision = self.schedule(pod, claims, self.cluster)
        if decision.ok:
            self._bind(pod, claims, decision, duration)
        else:
            self._reject(pod, decision)
            self.at(self.now + self.retry_every, "schedule", ns, pod_name, duration)

    def _bind(self, pod: Obj, claims: list[Obj], decision: Decision, duration: timedelta | None) -> None:
        assert decision.node is not None
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        for claim in claims:
            key = f"{ns}/{claim['metadata']['name']}"
            status = claim.get("status", {})
            if key in decision.allocations:
                status = nv.allocation_status(decision.allocations[key], decision.node, reserved_for=[pod])
            else:
                status = {**status, "reservedFor": [*status.get("reservedFor", []), nv.consumer_ref(pod)]}
            meta = {**claim["metadata"], "finalizers": ["resource.kubernetes.io/delete-protection"]}
            self.cluster.update({**claim, "metadata": meta, "status": status})
        spec = {**pod["spec"], "nodeName": decision.node}
        conditions = [nv.scheduled_condition(ts(self.now))]
        st = {**pod["status"], "phase": "Running", "conditions": conditions, "startTime": ts(self.now)}
        self.cluster.update({**pod, "spec": spec, "status": st})
        self._pending.discard((ns, name))
        if duration is not None:
            self.at(self.now + duration, "finish", ns, name)

    def _reject(self, pod: Obj, decision: Decision) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        cond = nv.unschedulable_condition(decision.message, ts(self.now), reason=decision.reason)
        old = [c for c in pod["status"].get("conditions", []) if c.get("type") == "PodScheduled"]
        if old and old[0].get("message") == decision.message and old[0].get("reason") == decision.reason:
            cond["lastTransitionTime"] = old[0]["lastTransitionTime"]
        else:
            self.cluster.update({**pod, "status": {**pod["status"], "conditions": [cond]}})
        ev_name = self._events.get((ns, name))
        ev = self.cluster.get("Event", ns, ev_name) if ev_name else None
        if ev is not None and ev["message"] == decision.message:
            self.cluster.update({**ev, "count": ev["count"] + 1, "lastTimestamp": ts(self.now)})
        else:
            ev = nv.failed_scheduling_event(pod, decision.message, first_timestamp=ts(self.now))
            if self.cluster.get("Event", ns, ev["metadata"]["name"]) is None:
                self.cluster.create(ev)
            self._events[(ns, name)] = ev["metadata"]["name"]

    def _release(self, pod: Obj, keep_allocation: bool = False) -> None:
        """Pod ends: drop it from reservedFor; deallocate unless `keep_allocation` (the leak)."""
        ns = pod["metadata"]["namespace"]
        for claim in self._claims_of(pod):
            status = dict(claim.get("status", {}))
            reserved = [r for r in status.get("reservedFor", []) if r.get("uid") != pod["metadata"]["uid"]]
            if reserved:
                status["reservedFor"] = reserved
            else:
                status.pop("reservedFor", None)
                if not keep_allocation:
                    status.pop("allocation", None)
            meta = dict(claim["metadata"])
            if "allocation" not in status:
                meta.pop("finalizers", None)
            updated = self.cluster.update({**claim, "metadata": meta, "status": status})
            owned = any(o.get("uid") == pod["metadata"]["uid"] for o in meta.get("ownerReferences", []))
            if owned and "allocation" not in updated.get("status", {}):
                self.cluster.delete("ResourceClaim", ns, meta["name"])

    def _do_finish(self, ns: str, pod_name: str) -> None:
        pod = self.cluster.get("Pod", ns, pod_name)
        if pod is None:
            return
        done = {**pod["status"], "phase": "Succeeded"}
        pod = self.cluster.update({**pod, "status": done})
        self._release(pod)
        self.cluster.delete("Pod", ns, pod_name)

    def _do_xid(self, node: str, gpu_minor: int, code: str) -> None:
        taint = {
            "key": "gpu.nvidia.com/xid",
            "value": code,
            "effect": "NoSchedule",
            "timeAdded": ts(self.now),
        }
        for slice_obj in self.cluster.slices_by_node().get(node, []):
            devices = slice_obj["spec"].get("devices") or []
            hit = [
                d
                for d in devices
                if _gpu_minor(d["name"]) == gpu_minor
                and taint["key"] not in {t["key"] for t in d.get("taints", [])}
            ]
            if hit:
                tainted = [{**d, "taints": [*d.get("taints", []), taint]} if d in hit else d for d in devices]
                self.cluster.update({**slice_obj, "spec": {**slice_obj["spec"], "devices": tainted}})

    def _do_node_loss(self, node: str) -> None:
        for pod in list(self.cluster.objects("Pod")):
            if pod["spec"].get("nodeName") == node:
                # The pod garbage collector deletes pods bound to a node that no longer exists.
                self._release(pod)
                self.cluster.delete("Pod", pod["metadata"]["namespace"], pod["metadata"]["name"])
        for slice_obj in self.cluster.slices_by_node().get(node, []):
            self.cluster.delete("ResourceSlice", None, slice_obj["metadata"]["name"])
        if self.cluster.get("Node", None, node) is not None:
            self.cluster.delete("Node", None, node)

    def _do_leak(self, ns: str, name: str, request: Obj, release_after: timedelta) -> None:
        claim = self.cluster.create(nv.claim_object(ns, name, [request], created=ts(self.now)))
        pod_name = f"{name}-notebook"
        pod = self.cluster.create(
            nv.pod_object(ns, pod_name, [(request["name"], nv.from_claim(name))], created=ts(self.now))
        )
        decision = self.schedule(pod, [claim], self.cluster)
        if not decision.ok:
            self.cluster.delete("Pod", ns, pod_name)
            return
        self._pending.add((ns, pod_name))
        self._bind(pod, [claim], decision, None)
        self.at(self.now + release_after, "leak_release", ns, pod_name)

    def _do_leak_release(self, ns: str, pod_name: str) -> None:
        pod = self.cluster.get("Pod", ns, pod_name)
        if pod is None:
            return
        self._release(pod, keep_allocation=True)
        self.cluster.delete("Pod", ns, pod_name)


def _gpu_minor(device_name: str) -> int | None:
    """ "gpu-3" and "gpu-3-mig-1g10gb-19-0" belong to GPU 3."""
    parts = device_name.split("-")
    return int(parts[1]) if len(parts) > 1 and parts[0] == "gpu" and parts[1].isdigit() else None


# ---- random workload mix ----------------------------------------------------------------------------------


def random_workloads(
    fleet: Fleet, seed: int, start: datetime, hours: float, per_hour: float = 20.0, durations: float = 1.0
) -> list[Workload]:
    """A seeded mix of training, gangs, MIG inference and a few mistakes sized to the fleet's models.
    ``durations`` scales how long each runs (the demo compresses a week into real time with it).

    Precondition: the fleet has at least one pool.
    """
    rng = random.Random(f"workloads/{seed}")
    models = sorted({p.model for p in fleet.spec.pools})
    mig_models = sorted({p.model for p in fleet.spec.pools if p.mode != "full"})
    out: list[Workload] = []
    n = int(hours * per_hour)
    for i in range(n):
        at = start + timedelta(hours=rng.uniform(0, hours))
        roll = rng.random()
        model = nv.MODELS[rng.choice(models)]
        hours_run = rng.choice([0.5, 1, 2, 4, 8, 24]) * durations
        if roll < 0.35:
            gpus = rng.choice([1, 2, 4, 8])
            out.append(
                training("ml-train", f"train-{i:05d}", at, gpus, [product_is(model.product_name)], hours_run)
            )
        elif roll < 0.50:
            out.append(
                gang("ml-train", f"gang-{i:05d}", at, rng.choice([2, 4]), 8, model.product_name, hours_run)
            )
        elif roll < 0.95 and mig_models:
            m = nv.MODELS[rng.choice(mig_models)]
            profiles = [m.profile("1g").name, m.profile("3g").name]
            out.append(inference_mig("inference", f"serve-{i:05d}", at, profiles, hours_run))
        else:
            kind = rng.choice(["broken-cel", "unknown-attribute", "impossible-memory"])
            out.append(broken("research", f"oops-{i:05d}", at, kind))
    out.sort(key=lambda w: (w.arrival, w.name))
    return out
