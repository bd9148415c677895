"""A real Kubernetes control plane with a published GPU fleet and scripted churn, for ``bench_e2e.py``.

    python -m bench.e2e.cpserver --dir RUN_DIR [--nodes 500] [--threads 8]

The control-plane counterpart of ``simserver.py``, driven by the same command files, so the orchestrator's
phases run unchanged against either. Starts ``tests.controlplane.launcher.ControlPlane`` (etcd,
kube-apiserver, kube-controller-manager, kube-scheduler from ``tests/controlplane/build.sh``; work dir and
logs in ``RUN_DIR/controlplane``), publishes ``--nodes`` GPU nodes with their ResourceSlices the way
``bench/bench_sync.py`` does (B200/H100/H200/B300 in turn, every third node static MIG), then, with no
kubelets and no scheduler involved, what a busy cluster holds: 90 % of the whole GPUs and half of the
static MIG devices taken, each by a claim whose ``status.allocation`` is written through the status
subresource (reserved for its pod) and a pod bound to the node (``spec.nodeName``) whose status says
Running; and 5 % more claims pending, in ``simserver.pending_shapes``. ``RUN_DIR/kubeconfig`` is the admin
kubeconfig; ``RUN_DIR/sim.json`` the object counts as listed back from the API server.

Commands (files the orchestrator drops into ``RUN_DIR``, polled every 100 ms):

* ``churn.go``: up to ``rate`` watch events/s for ``seconds`` through the API server, from ``--threads``
  threads: a held claim is released (claim status without allocation and reservation + its pod's status
  back to Pending: 2 events), re-allocated to the same device 2 s after the release returned (2 events),
  and 5 % of the steps toggle a health taint on a device of a whole-GPU slice (1 event). A step is only
  started when a thread is free, so what the API server cannot take shows as a lower achieved rate, never
  as a queue. Every change the heatmap shows is written to ``probes.jsonl`` with the wall-clock time the
  API server's answer arrived (the write is committed in etcd by then): ``[t, row key, gpu index,
  "slices"|"tainted", value, [kind, key written]]`` (the key as change events name it: the released or
  re-allocated claim, the tainted slice). ``churn.done`` gets the counts, the request latencies and the
  errors.
* ``change.go``: one fleet change (a taint on one GPU), for the diagnosis timing; answered by ``change.done``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.e2e.simserver import HOLD_SECONDS, TAINT, TAINT_SHARE, pending_shapes
from simulator import nvidia as nv
from tests.controlplane.kube import ApiError, Kube
from tests.controlplane.launcher import ControlPlane
from tests.controlplane.nodes import for_create
from tests.controlplane.publisher import FleetPublisher

Obj = dict[str, Any]
CLUSTER = "sim"  # the cluster name the orchestrator configures (row keys are "<cluster>/<node>")
MODELS = ("B200", "H100", "H200", "B300")
FULL_SHARE = 0.9  # of the whole GPUs held by a running pod
MIG_SHARE = 0.5  # of the static MIG devices held
PENDING_SHARE = 0.05  # pending claims, as a share of all claims
NAMESPACES = ("ml", "bench")
COUNTED = ("Node", "ResourceSlice", "ResourceClaim", "Pod", "DeviceClass")


def node_name(i: int) -> tuple[str, str, str]:
    """(name, model, mode) of the i-th node: models in turn, every third node static MIG."""
    model = MODELS[i % len(MODELS)]
    mode = "static-mig" if i % 3 == 2 else "full"
    suffix = "-mig" if mode != "full" else ""
    return f"{model.lower()}{suffix}-{i:04d}", model, mode


def parallel(threads: int, fn: Any, items: list[Any]) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(fn, items))


class Held:
    """One allocated claim and its pod as created (``probe``: the heatmap cell it moves)."""

    __slots__ = ("claim", "node", "pod", "probe", "status")

    def __init__(self, claim: str, pod: str, node: str, status: Obj, probe: tuple[str, int] | None) -> None:
        self.claim, self.pod, self.node, self.status, self.probe = claim, pod, node, status, probe


def publish(kube: Kube, nodes: int, threads: int) -> tuple[list[Obj], list[Obj]]:
    """Device classes, nodes and slices; returns (whole-GPU slices, static MIG slices) as stored."""
    publisher = FleetPublisher(kube)
    publisher.device_classes()

    def one(i: int) -> list[Obj]:
        name, model, mode = node_name(i)
        return publisher.gpu_node(name, model, mode=mode, layout="balanced" if mode != "full" else None)

    full: list[Obj] = []
    mig: list[Obj] = []
    for stored in parallel(threads, one, list(range(nodes))):
        for s in stored:
            if s["spec"].get("driver") != "gpu.nvidia.com":
                continue
            (mig if "-mig-" in s["spec"]["nodeName"] else full).append(s)
    return full, mig


def devices_to_hold(full: list[Obj], mig: list[Obj], rng: random.Random) -> list[tuple[str, str, str, Any]]:
    """(node, pool, device, probe) for 90 % of the whole GPUs and half of the static MIG devices."""
    whole: list[tuple[str, str, str, Any]] = []
    parts: list[tuple[str, str, str, Any]] = []
    for slices, out in ((full, whole), (mig, parts)):
        for s in slices:
            spec = s["spec"]
            for d in spec.get("devices", []):
                if d.get("consumesCounters"):
                    continue  # partitions of a dynamic layout stay free
                probe = (spec["nodeName"], int(d["name"][4:])) if out is whole else None
                out.append((spec["nodeName"], spec["pool"]["name"], d["name"], probe))
    rng.shuffle(whole)
    rng.shuffle(parts)
    return whole[: int(len(whole) * FULL_SHARE)] + parts[: int(len(parts) * MIG_SHARE)]


def wait_for_service_account(kube: Kube, namespace: str, timeout: float = 60) -> None:
    # The ServiceAccount admission plugin refuses pods until the controller made "default".
    deadline = time.monotonic() + timeout
    while True:
        try:
            kube.get("ServiceAccount", "default", namespace)
            return
        except ApiError as err:
            if err.code != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def create_held(kube: Kube, i: int, node: str, pool: str, device: str, probe: Any) -> Held:
    """A running pod on ``node`` and its claim, allocated ``device`` and reserved for the pod."""
    claim_name, pod_name = f"job-{i}-gpu", f"job-{i}"
    pod = nv.pod_object("ml", pod_name, [("gpu", {"resourceClaimName": claim_name})], node=node)
    created = kube.create(for_create(pod))
    kube.patch("Pod", pod_name, {"status": pod["status"]}, namespace="ml", subresource="status")
    claim = nv.claim_object("ml", claim_name, [nv.exactly_request("gpu", "gpu.nvidia.com")])
    kube.create(for_create(claim))
    status = nv.allocation_status([{"request": "gpu", "pool": pool, "device": device}], node, [created])
    kube.patch("ResourceClaim", claim_name, {"status": status}, namespace="ml", subresource="status")
    return Held(claim_name, pod_name, node, status, probe)


def build(kube: Kube, nodes: int, threads: int) -> tuple[list[Held], list[Obj]]:
    rng = random.Random(11)
    full, mig = publish(kube, nodes, threads)
    for ns in NAMESPACES:
        kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        wait_for_service_account(kube, ns)
    chosen = devices_to_hold(full, mig, rng)
    held = parallel(threads, lambda a: create_held(kube, a[0], *a[1]), list(enumerate(chosen)))
    shapes = pending_shapes()
    pending = int(len(held) * PENDING_SHARE / (1 - PENDING_SHARE))

    def one_pending(i: int) -> None:
        reqs, cons = rng.choice(shapes)
        kube.create(for_create(nv.claim_object("bench", f"pending-{i}", reqs, cons)))

    parallel(threads, one_pending, list(range(pending)))
    return held, full


def counts(kube: Kube) -> dict[str, int]:
    return {kind: len(kube.list(kind)) for kind in COUNTED}


class Churn:
    """Releases and re-allocates held claims, and toggles device taints, through the API server."""

    def __init__(
        self, kube: Kube, held: list[Held], taintable: list[Obj], run_dir: Path, threads: int
    ) -> None:
        self.kube, self.held, self.threads = kube, held, threads
        self.rng = random.Random(5)
        self.order = list(range(len(held)))
        self.rng.shuffle(self.order)
        self.next = 0
        # Slice name -> its devices as last written; a slice is written by one thread at a time.
        self.slices = {
            s["metadata"]["name"]: (s["spec"]["nodeName"], s["spec"]["devices"]) for s in taintable
        }
        self.slice_locks = {name: threading.Lock() for name in self.slices}
        self.taintable = sorted(self.slices)
        self.inflight = 0
        self.busy: set[int] = set()  # held claims with a write in flight or waiting to be given back
        self.released: deque[tuple[float, int]] = deque()
        self.lock = threading.Lock()
        self.counts = {"events": 0, "released": 0, "reallocated": 0, "taints": 0, "probes": 0, "errors": 0}
        self.request_ms: list[float] = []
        self.error_samples: list[str] = []
        self.probes = open(run_dir / "probes.jsonl", "a")  # noqa: SIM115 (open for the process lifetime)

    def probe(self, t: float, node: str, index: int, what: str, value: int, wrote: list[str]) -> None:
        with self.lock:
            self.probes.write(json.dumps([t, f"{CLUSTER}/{node}", index, what, value, wrote]) + "\n")
            self.counts["probes"] += 1

    def _patch(self, kind: str, name: str, body: Obj, namespace: str = "", subresource: str = "") -> None:
        t = time.perf_counter()
        self.kube.patch(kind, name, body, namespace=namespace, subresource=subresource)
        ms = (time.perf_counter() - t) * 1000
        with self.lock:
            self.request_ms.append(ms)

    def release(self, i: int) -> int:
        h = self.held[i]
        self._patch(
            "ResourceClaim", h.claim, {"status": {"allocation": None, "reservedFor": None}}, "ml", "status"
        )
        t = time.time()
        self._patch("Pod", h.pod, {"status": {"phase": "Pending"}}, "ml", "status")
        if h.probe:
            self.probe(t, h.probe[0], h.probe[1], "slices", 0, ["ResourceClaim", f"ml/{h.claim}"])
        with self.lock:
            self.released.append((time.monotonic(), i))
            self.counts["released"] += 1
        return 2

    def reallocate(self, i: int) -> int:
        h = self.held[i]
        self._patch("ResourceClaim", h.claim, {"status": h.status}, "ml", "status")
        t = time.time()
        self._patch("Pod", h.pod, {"status": {"phase": "Running"}}, "ml", "status")
        if h.probe:
            self.probe(t, h.probe[0], h.probe[1], "slices", 7, ["ResourceClaim", f"ml/{h.claim}"])
        with self.lock:
            self.busy.discard(i)
            self.counts["reallocated"] += 1
        return 2

    def toggle_taint(self, name: str | None = None) -> int:
        name = name or self.rng.choice(self.taintable)
        with self.slice_locks[name]:
            node, devices = self.slices[name]
            devices = [dict(d) for d in devices]
            d = self.rng.choice(devices)
            on = not d.get("taints")
            if on:
                d["taints"] = [dict(TAINT)]
            else:
                d.pop("taints", None)
            self._patch("ResourceSlice", name, {"spec": {"devices": devices}})
            self.slices[name] = (node, devices)
            self.probe(time.time(), node, int(d["name"][4:]), "tainted", int(on), ["ResourceSlice", name])
        with self.lock:
            self.counts["taints"] += 1
        return 1

    def pick(self) -> tuple[int, Callable[[], int]] | None:
        """The next step (its events, the call), chosen on the dispatching thread: one random stream."""
        with self.lock:
            if self.released and time.monotonic() - self.released[0][0] >= HOLD_SECONDS:
                i = self.released.popleft()[1]
                return 2, functools.partial(self.reallocate, i)
        if self.rng.random() < TAINT_SHARE:
            name = self.rng.choice(self.taintable)
            return 1, functools.partial(self.toggle_taint, name)
        for _ in range(len(self.order)):
            j = self.order[self.next % len(self.order)]
            self.next += 1
            with self.lock:
                if j not in self.busy:
                    self.busy.add(j)
                    return 2, functools.partial(self.release, j)
        return None

    def _done(self, fut: Future[int]) -> None:
        with self.lock:
            self.inflight -= 1
            err = fut.exception()
            if err is None:
                self.counts["events"] += fut.result()
            else:
                self.counts["errors"] += 1
                if len(self.error_samples) < 10:
                    self.error_samples.append(repr(err)[:300])

    def run(self, rate: float, seconds: float) -> None:
        started = 0.0  # events of the steps started
        with ThreadPoolExecutor(self.threads) as pool:
            start = time.monotonic()
            while (elapsed := time.monotonic() - start) < seconds:
                while started < rate * elapsed and self.inflight < self.threads:
                    step = self.pick()
                    if step is None:
                        break
                    with self.lock:
                        self.inflight += 1
                    pool.submit(step[1]).add_done_callback(self._done)
                    started += step[0]
                self.probes.flush()
                time.sleep(0.005)
            # Give every released claim its device back, so the fleet ends as it started.
            while True:
                with self.lock:
                    if not self.inflight and not self.released:
                        break
                    ready = self.released.popleft()[1] if self.released else None
                if ready is None:
                    time.sleep(0.05)
                    continue
                with self.lock:
                    self.inflight += 1
                pool.submit(self.reallocate, ready).add_done_callback(self._done)
        self.probes.flush()


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    s = sorted(values)
    return {f"p{q}": round(s[min(len(s) - 1, int(q / 100 * len(s)))], 1) for q in (50, 95, 99)}


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--threads", type=int, default=8, help="client threads for setup and churn")
    args = parser.parse_args()
    run_dir = Path(args.dir).resolve()
    # SIGTERM (the orchestrator stopping its processes) at any point, the setup included, leaves the
    # ``with`` below, which stops the components in order (the apiserver before etcd).
    signal.signal(signal.SIGTERM, interrupt)
    work = run_dir / "controlplane"
    shutil.rmtree(work, ignore_errors=True)
    with contextlib.suppress(KeyboardInterrupt), ControlPlane(work_dir=work) as cp:
        print(f"control plane ready in {cp.startup_seconds:.1f}s at {cp.url}", flush=True)
        kube = cp.client()
        t0 = time.perf_counter()
        held, full = build(kube, args.nodes, args.threads)
        build_s = time.perf_counter() - t0
        gpu_slices = [
            s for s in full if any(d["name"].startswith("gpu-") for d in s["spec"].get("devices", []))
        ]
        tmp = run_dir / "kubeconfig.tmp"
        shutil.copy(cp.kubeconfig, tmp)
        os.replace(tmp, run_dir / "kubeconfig")
        listed = counts(kube)
        info = {
            "build_seconds": round(build_s, 1),
            "controlplane_start_seconds": round(cp.startup_seconds, 1),
            "nodes": args.nodes,
            "held": len(held),
            "counts": listed,
        }
        (run_dir / "sim.json").write_text(json.dumps(info))
        print(f"fleet ready in {build_s:.1f}s: {info}", flush=True)
        churn = Churn(kube, held, gpu_slices, run_dir, args.threads)
        while True:
            time.sleep(0.1)
            go = run_dir / "churn.go"
            if go.exists():
                params = json.loads(go.read_text())
                go.unlink()
                t = time.time()
                churn.run(float(params["rate"]), float(params["seconds"]))
                done = {
                    **churn.counts,
                    "started": t,
                    "ended": time.time(),
                    "threads": args.threads,
                    "request_ms": percentiles(churn.request_ms),
                    "requests": len(churn.request_ms),
                    "error_samples": churn.error_samples,
                }
                # Whole or not at all: the bench reads it as soon as it exists.
                (run_dir / "churn.done.tmp").write_text(json.dumps(done))
                os.replace(run_dir / "churn.done.tmp", run_dir / "churn.done")
            change = run_dir / "change.go"
            if change.exists():
                change.unlink()
                churn.toggle_taint()
                churn.probes.flush()
                (run_dir / "change.done").write_text(json.dumps({"t": time.time()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
