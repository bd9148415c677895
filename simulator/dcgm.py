"""A dcgm-exporter stand-in: the GPU metrics of a simulated cluster, in dcgm-exporter's exposition format.

The simulator has no GPUs, so this module plays the part of NVIDIA's dcgm-exporter on every simulated node.
Metric names and labels are dcgm-exporter's (4.x, with ``KUBERNETES_ENABLE_DRA=true``):

    DCGM_FI_PROF_GR_ENGINE_ACTIVE{gpu="3",UUID="GPU-…",pci_bus_id="…",device="nvidia3",
        modelName="NVIDIA H100 80GB HBM3"[,GPU_I_PROFILE="1g.10gb",GPU_I_ID="3"],Hostname="node-7",
        [container,namespace,pod,dra_claim_name,dra_claim_namespace,dra_driver_name,dra_pool_name,
         dra_device_name[,dra_mig_profile,dra_mig_device_uuid]]} 0.42

- one series per physical GPU, or per MIG instance (``GPU_I_PROFILE``/``GPU_I_ID``; ``UUID`` is then the
  parent GPU's); ``DCGM_FI_DEV_GPU_UTIL`` and power are not reported for MIG instances (NVML does not);
- the DRA labels are present only on devices some claim holds; ``dra_mig_device_uuid`` is NVML's
  ``MIG-…`` form (the DRA driver publishes the same UUID lower-cased);
- the known gaps are reproduced: dynamic-MIG instances (created on allocation) carry no DRA labels, and an
  exporter can restart (its endpoint is down for a while, then serves again).

Values come from a per-workload activity profile (:func:`activity_of`), deterministic in (claim, time):
no randomness, so tests and the demo see the same numbers for the same inputs.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from wsgiref.simple_server import WSGIServer

from simulator import nvidia as nv

Obj = dict[str, Any]

ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
POWER = "DCGM_FI_DEV_POWER_USAGE"
HELP = {
    ENGINE_ACTIVE: "Ratio of time the graphics engine is active.",
    GPU_UTIL: "GPU utilization (in %).",
    FB_USED: "Framebuffer memory used (in MiB).",
    FB_FREE: "Framebuffer memory free (in MiB).",
    POWER: "Power draw (in W).",
}
MIB = 1024 * 1024
IDLE_WORDS = ("notebook", "jupyter", "interactive", "idle")
BUSY_WORDS = ("pretrain", "finetune", "train", "sweep", "gang")
SERVING_WORDS = ("chat", "rag", "infer", "serve")

Activity = Callable[[str, str, datetime], float]


def _jitter(*parts: object) -> float:
    """A stable number in [0, 1) for the parts: the stand-in's noise, identical on every run."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32


def activity_of(namespace: str, claim: str, at: datetime) -> float:
    """Graphics-engine activity (0..1) of the workload holding a claim at a time.

    Notebooks and interactive claims idle (under 3 %), training runs near saturation, serving follows the
    day (15-60 %), anything else hovers around half. ``pretrain-2`` is the simulated stuck job: it holds
    its GPUs and does nothing, which is what the idle report exists to find.
    """
    minute = int(at.timestamp() // 60)
    noise = _jitter(namespace, claim, minute)
    name = claim.lower()
    if any(w in name for w in IDLE_WORDS) or name.startswith("pretrain-2"):
        return round(0.03 * noise, 4)
    if any(w in name for w in BUSY_WORDS):
        return round(0.85 + 0.12 * noise, 4)
    if any(w in name for w in SERVING_WORDS):
        day = (math.sin((at.hour + at.minute / 60 - 8) / 24 * 2 * math.pi) + 1) / 2
        return round(0.15 + 0.4 * day + 0.05 * noise, 4)
    return round(0.4 + 0.2 * noise, 4)


@dataclass(frozen=True)
class Holder:
    """The claim (and its first consumer pod) a device is allocated to."""

    namespace: str
    claim: str
    pod: str
    container: str


@dataclass(frozen=True)
class Series:
    """One exposition line: metric name, labels, value (the shape usage's samplers read)."""

    metric: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class _Unit:
    """What one dcgm-exporter entity row describes: a GPU, or a MIG instance of one."""

    node: str
    minor: int
    uuid: str
    product: str
    pci_bus_id: str
    memory_bytes: int
    device: str  # the DRA device name
    pool: str
    mig_profile: str = ""
    instance_id: int = 0
    mig_uuid: str = ""
    dynamic: bool = False
    model_power: float = 700.0


def _attr(dev: Obj, name: str) -> str:
    value = dev.get("attributes", {}).get(name, {})
    return str(next(iter(value.values()), "")) if isinstance(value, dict) else ""


def _memory(dev: Obj) -> int:
    text = dev.get("capacity", {}).get("memory", {}).get("value", "0")
    return nv.parse_quantity(str(text))


def _minor(name: str) -> int:
    return int(name.split("-")[1])


def holders(claims: Iterable[Obj], pods: Mapping[tuple[str, str], Obj]) -> dict[tuple[str, str, str], Holder]:
    """Holder per (driver, pool, device) from ResourceClaims' allocation results (adminAccess excluded)."""
    out: dict[tuple[str, str, str], Holder] = {}
    for claim in claims:
        meta, status = claim["metadata"], claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        consumers = [r for r in status.get("reservedFor") or [] if r.get("resource") == "pods"]
        pod_name = consumers[0]["name"] if consumers else ""
        pod = pods.get((meta["namespace"], pod_name)) or {}
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        container = str(containers[0].get("name", "")) if pod_name else ""
        for r in results:
            if r.get("adminAccess"):
                continue
            holder = Holder(meta["namespace"], meta["name"], pod_name, container)
            out[(r["driver"], r["pool"], r["device"])] = holder
    return out


def _units(slices: Iterable[Obj], allocated: Mapping[tuple[str, str, str], Holder]) -> list[_Unit]:
    """The entities dcgm-exporter would report: GPUs, static MIG instances, allocated dynamic ones."""
    by_gpu: dict[str, list[tuple[Obj, str, str]]] = {}
    for s in slices:
        spec = s["spec"]
        if spec.get("driver") != nv.GPU_DRIVER:
            continue
        for dev in spec.get("devices") or []:
            key = _attr(dev, "uuid") if _attr(dev, "type") == "gpu" else _attr(dev, "parentUUID")
            if not key:
                continue
            by_gpu.setdefault(key, []).append(
                (dev, spec["pool"]["name"], spec.get("nodeName") or spec["pool"]["name"])
            )
    units: list[_Unit] = []
    for gpu_uuid in sorted(by_gpu):
        devs = by_gpu[gpu_uuid]
        gpu = next((d for d in devs if _attr(d[0], "type") == "gpu"), None)
        migs = [d for d in devs if _attr(d[0], "type") == "mig"]
        static = [d for d in migs if _attr(d[0], "uuid")]
        dynamic_held = [
            d for d in migs if not _attr(d[0], "uuid") and (nv.GPU_DRIVER, d[1], d[0]["name"]) in allocated
        ]
        first = gpu or devs[0]
        dev0, pool, node = first
        minor = _minor(dev0["name"])
        base: dict[str, Any] = {
            "node": node,
            "minor": minor,
            "uuid": gpu_uuid,
            "product": _attr(dev0, "productName"),
            "pci_bus_id": _attr(dev0, "resource.kubernetes.io/pciBusID"),
            "pool": pool,
        }
        instances = static or dynamic_held
        if instances:
            # GPU instance ids are handed out in creation order; placement order stands in for it.
            ordered = sorted(instances, key=lambda d: int(d[0]["name"].rsplit("-", 1)[1]))
            for gi, (dev, _, _) in enumerate(ordered, start=1):
                units.append(
                    _Unit(
                        **base,
                        memory_bytes=_memory(dev),
                        device=dev["name"],
                        mig_profile=_attr(dev, "profile"),
                        instance_id=gi,
                        mig_uuid=_attr(dev, "uuid").replace("mig-", "MIG-", 1),
                        dynamic=not static,
                    )
                )
        elif gpu is not None:
            units.append(_Unit(**base, memory_bytes=_memory(gpu[0]), device=gpu[0]["name"]))
    return units


def series(
    slices: Iterable[Obj],
    claims: Iterable[Obj],
    pods: Iterable[Obj],
    at: datetime,
    activity: Activity = activity_of,
) -> list[Series]:
    """Every DCGM series the exporters of a simulated cluster serve at a time (pure)."""
    pod_index = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    allocated = holders(claims, pod_index)
    out: list[Series] = []
    for u in _units(slices, allocated):
        labels: dict[str, str] = {
            "gpu": str(u.minor),
            "UUID": u.uuid,
            "pci_bus_id": u.pci_bus_id,
            "device": f"nvidia{u.minor}",
            "modelName": u.product,
        }
        if u.mig_profile:
            labels |= {"GPU_I_PROFILE": u.mig_profile, "GPU_I_ID": str(u.instance_id)}
        labels["Hostname"] = u.node
        holder = allocated.get((nv.GPU_DRIVER, u.pool, u.device))
        if holder is not None and not u.dynamic:
            labels |= {
                "container": holder.container,
                "namespace": holder.namespace,
                "pod": holder.pod,
                "dra_claim_name": holder.claim,
                "dra_claim_namespace": holder.namespace,
                "dra_driver_name": nv.GPU_DRIVER,
                "dra_pool_name": u.pool,
                "dra_device_name": u.device,
            }
            if u.mig_profile:
                labels |= {"dra_mig_profile": u.mig_profile, "dra_mig_device_uuid": u.mig_uuid}
        busy = activity(holder.namespace, holder.claim, at) if holder else 0.0
        total_mib = u.memory_bytes // MIB
        used_mib = int(total_mib * (0.3 + 0.6 * busy)) if holder else 0
        out.append(Series(ENGINE_ACTIVE, labels, busy))
        out.append(Series(FB_USED, labels, float(used_mib)))
        out.append(Series(FB_FREE, labels, float(total_mib - used_mib)))
        if not u.mig_profile:
            out.append(Series(GPU_UTIL, labels, float(round(min(100.0, busy * 110)))))
            out.append(Series(POWER, labels, round(u.model_power * (0.12 + 0.85 * busy), 3)))
    return out


def cluster_series(cluster: Any, at: datetime, activity: Activity = activity_of) -> list[Series]:
    """:func:`series` of a ``SimulatedCluster`` (highest slice generation per pool, as the driver serves)."""
    slices = [s for per_node in cluster.slices_by_node().values() for s in per_node]
    return series(slices, cluster.objects("ResourceClaim"), cluster.objects("Pod"), at, activity)


# ------------------------------------------------------------------------------------------- the exporter


@dataclass(eq=False)  # registered as a collector: hashed by identity
class DcgmExporter:
    """Serves :func:`series` over HTTP at ``/metrics``, rendered by the ``prometheus-client`` library.

    ``source`` returns the current series (e.g. ``lambda: cluster_series(cluster, now())``). ``stop`` and
    ``start`` again on the same port is an exporter restart: Prometheus sees the target down, then back.
    """

    source: Callable[[], list[Series]]
    host: str = "127.0.0.1"
    port: int = 0
    _server: WSGIServer | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        families: dict[str, Any] = {}
        for s in self.source():
            family = families.get(s.metric)
            if family is None:
                family = families[s.metric] = GaugeMetricFamily(s.metric, HELP.get(s.metric, s.metric))
            family.samples.append(_sample(s))
        yield from families.values()

    def start(self) -> int:
        """Start serving (in a daemon thread); returns the port."""
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        self._server, self._thread = start_http_server(self.port, addr=self.host, registry=registry)
        self.port = self._server.server_port
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"


def _sample(s: Series) -> Any:
    from prometheus_client.samples import Sample

    return Sample(s.metric, dict(s.labels), s.value, None, None)


class InProcessSource:
    """The stand-in's series without HTTP or Prometheus: what the demo samples (``usage`` reads any
    source whose ``samples()`` returns objects with ``metric``, ``labels`` and ``value``)."""

    def __init__(self, series: Callable[[], list[Series]]) -> None:
        self.series = series

    def samples(self) -> tuple[list[Series], float]:
        return self.series(), 0.0


def now() -> datetime:
    return datetime.now(UTC)
