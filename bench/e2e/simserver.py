"""The simulated L fleet behind the Kubernetes HTTP protocol, with scripted churn, for ``bench_e2e.py``.

    python -m bench.e2e.simserver --dir RUN_DIR [--preset L|XL] [--rate 500] [--seconds 120]

Builds the preset's nodes and slices, 38,000 allocated claims (every full GPU of the whole-GPU pools, then
static MIG devices) with their running pods, and 2,000 pending claims of the diagnosis benchmark's shapes;
serves them with :class:`simulator.apiserver.SimulatorAPIServer` and writes ``RUN_DIR/kubeconfig``.

Commands are files the orchestrator drops into ``RUN_DIR`` (polled every 100 ms):

* ``churn.go``: ``rate`` watch events per second for ``seconds``: a held claim is released (claim without
  allocation + its pod back to Pending: 2 events), re-allocated to the same device 2 s later (2 events),
  and 5 % of the events toggle a health taint on a whole-GPU slice (1 event). Every change the heatmap
  shows (a full GPU 7/7 <-> 0/7, a taint flag) is written to ``probes.jsonl`` with the wall-clock time of
  the write: ``[t, row key, gpu index, "slices"|"tainted", expected value, [kind, key written]]`` (the key as
  change events name it: the released or re-allocated claim, the tainted slice). ``churn.done`` gets the
  counts.
* ``restart.go``: ``{"down": seconds}``: the API server stops (every watch ends), stays away, compacts its
  history (resumes get 410 Gone) and serves again on the same port; answered by ``restart.done``.
* ``change.go``: one fleet change (a taint on one GPU), for the diagnosis timing; answered by ``change.done``.

Why our own process and not ``manage.py simulate``: that command serves the small "monday" scenario; the
benchmark needs the L fleet with a controlled event rate.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import secrets
import signal
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fleet.kube.source import Gone
from simulator import nvidia as nv
from simulator.apiserver import SimulatorAPIServer
from simulator.cluster import KINDS, SimulatedCluster
from simulator.spec import build_fleet, preset

Obj = dict[str, Any]
CLUSTER = "sim"  # the cluster name the orchestrator configures (row keys are "<cluster>/<node>")
FULL_POOLS = ("b200", "b300", "h100", "h200")
# Claims per preset: (allocated with a running pod, pending).
CLAIMS = {"L": (38_000, 2_000), "XL": (114_000, 6_000)}
HOLD_SECONDS = 2.0
TAINT_SHARE = 0.05
TICK = 0.02
GPU = "device.attributes['gpu.nvidia.com']"
CAP = "device.capacity['gpu.nvidia.com']"
TAINT = {
    "key": "gpu.nvidia.com/xid",
    "value": "79",
    "effect": "NoSchedule",
    "timeAdded": "2026-03-02T08:00:00Z",
}


def pending_shapes() -> list[tuple[list[Obj], list[Obj]]]:
    """Pending claim shapes (a subset of bench_diagnosis.SHAPES: fits, capacity, no match, CEL error)."""
    return [
        (
            [
                nv.exactly_request(
                    "g", "gpu.nvidia.com", 1, [f"{CAP}.memory.compareTo(quantity('150Gi')) >= 0"]
                )
            ],
            [],
        ),
        (
            [nv.exactly_request("g", "gpu.nvidia.com", 4, [f"{GPU}.productName == 'NVIDIA H100 80GB HBM3'"])],
            [],
        ),
        ([nv.exactly_request("g", "mig.nvidia.com", 1, [f"{GPU}.profile == '1g.10gb'"])], []),
        (
            [nv.exactly_request("g", "gpu.nvidia.com", 8)],
            [{"requests": ["g"], "matchAttribute": "gpu.nvidia.com/productName"}],
        ),
        (
            [
                nv.exactly_request(
                    "g", "gpu.nvidia.com", 1, [f"{CAP}.memory.compareTo(quantity('400Gi')) >= 0"]
                )
            ],
            [],
        ),
        ([nv.exactly_request("g", "gpu.nvidia.com", 1, [f"{GPU}.gpuMemoryGiB >= 80"])], []),
    ]


class IndexedCluster(SimulatedCluster):
    """The simulator's cluster with its change history also kept per kind, newest last.

    ``SimulatedCluster._events_after`` scans the whole history (60,000 events here) every time a watch
    wakes up; at 500 events/s and seven open watches that scan ate the simulator's CPU and it could not
    produce the rate asked for (229 events/s measured). Here a wake-up reads only the new events of its
    kind, from the end. Semantics are the base class's (same 410 rule, same event objects).
    """

    def __init__(self, history_limit: int = 50_000, start_resource_version: int = 1000) -> None:
        super().__init__(history_limit, start_resource_version)
        self._by_kind: dict[str, deque[tuple[int, str, Obj]]] = {k: deque() for k in KINDS}

    def _record(self, kind: str, event_type: str, obj: Obj) -> None:
        super()._record(kind, event_type, obj)
        events = self._by_kind[kind]
        events.append((self._rv, event_type, obj))
        while events and events[0][0] <= self._compacted:
            events.popleft()

    def _events_after(self, kind: str, rv: int) -> tuple[list[Obj], int]:
        with self._cond:
            if rv < self._compacted:
                raise Gone
            out = []
            for erv, event_type, obj in reversed(self._by_kind[kind]):
                if erv <= rv:
                    break
                out.append({"type": event_type, "object": obj})
            out.reverse()
            return out, max(rv, self._rv)


def _written(claim: Obj) -> list[str]:
    """A probe's [kind, key] as the change events name what a batch wrote (``fleet.ingest.events``)."""
    meta = claim["metadata"]
    return ["ResourceClaim", f"{meta['namespace']}/{meta['name']}"]


class Held:
    """One allocated claim, its pod and the device it holds (``probe``: the heatmap cell it moves)."""

    __slots__ = ("claim", "original", "pod", "probe")

    def __init__(self, claim: Obj, pod: Obj, probe: tuple[str, int] | None) -> None:
        self.claim, self.pod, self.probe = claim, pod, probe
        self.original = (claim, pod)  # allocated, running: what a re-allocation writes back


def build(name: str) -> tuple[IndexedCluster, list[Held], list[Obj]]:
    fleet = build_fleet(preset(name))
    devices: list[tuple[str, str, str, tuple[str, int] | None]] = []
    mig: list[tuple[str, str, str, tuple[str, int] | None]] = []
    for s in fleet.slices:
        spec = s["spec"]
        if spec["driver"] != "gpu.nvidia.com" or not spec.get("nodeName"):
            continue
        node = spec["nodeName"]
        for d in spec.get("devices", []):
            if d.get("consumesCounters"):
                continue  # dynamic MIG partitions stay free
            if node.split("-")[0] in FULL_POOLS and "-mig" not in node and d["name"].startswith("gpu-"):
                devices.append((node, spec["pool"]["name"], d["name"], (node, int(d["name"][4:]))))
            else:
                mig.append((node, spec["pool"]["name"], d["name"], None))
    allocated, pending = CLAIMS.get(name, CLAIMS["L"])
    chosen = (devices + mig)[:allocated]
    held: list[Held] = []
    objs: list[Obj] = [nv.claim_template("ml", "one-gpu", [nv.exactly_request("gpu", "gpu.nvidia.com")])]
    for i, (node, pool, device, probe) in enumerate(chosen):
        pod = nv.pod_object(
            "ml", f"job-{i}", [("gpu", "one-gpu")], node=node, claim_statuses={"gpu": f"job-{i}-gpu"}
        )
        status = nv.allocation_status([{"request": "gpu", "pool": pool, "device": device}], node, [pod])
        claim = nv.claim_object(
            "ml",
            f"job-{i}-gpu",
            [nv.exactly_request("gpu", "gpu.nvidia.com")],
            status=status,
            owner_pod=pod,
            pod_claim_name="gpu",
        )
        held.append(Held(claim, pod, probe))
        objs += [claim, pod]
    shapes = pending_shapes()
    rng = random.Random(11)
    for i in range(pending):
        reqs, cons = rng.choice(shapes)
        objs.append(nv.claim_object("bench", f"pending-{i}", reqs, cons))
    sim = IndexedCluster(history_limit=max(60_000, allocated // 2))
    sim.bulk_create([*fleet.objects(), *objs])
    # The stored copies carry the resourceVersion; keep working on those.
    for h in held:
        h.claim = sim.get("ResourceClaim", "ml", h.claim["metadata"]["name"]) or h.claim
        h.pod = sim.get("Pod", "ml", h.pod["metadata"]["name"]) or h.pod
        h.original = (h.claim, h.pod)
    taintable = [
        s
        for s in sim.objects("ResourceSlice")
        if s["spec"].get("nodeName", "").split("-")[0] in FULL_POOLS
        and "-mig" not in s["spec"]["nodeName"]
        and "-dyn" not in s["spec"]["nodeName"]
        and s["spec"]["driver"] == "gpu.nvidia.com"
    ]
    return sim, held, taintable


class Churn:
    def __init__(self, sim: SimulatedCluster, held: list[Held], taintable: list[Obj], run_dir: Path) -> None:
        self.sim, self.held, self.run_dir = sim, held, run_dir
        self.taintable = [s["metadata"]["name"] for s in taintable]
        self.rng = random.Random(5)
        self.order = list(range(len(held)))
        self.rng.shuffle(self.order)
        self.next = 0
        self.released: deque[tuple[float, int]] = deque()
        self.counts = {"events": 0, "released": 0, "reallocated": 0, "taints": 0, "probes": 0}
        self.probes = open(run_dir / "probes.jsonl", "a")  # noqa: SIM115 (open for the process lifetime)

    def probe(self, t: float, node: str, index: int, what: str, value: int, wrote: list[str]) -> None:
        self.probes.write(json.dumps([t, f"{CLUSTER}/{node}", index, what, value, wrote]) + "\n")
        self.counts["probes"] += 1

    def release(self, i: int) -> int:
        h = self.held[i]
        status = {
            k: v for k, v in h.claim.get("status", {}).items() if k not in ("allocation", "reservedFor")
        }
        meta = {k: v for k, v in h.claim["metadata"].items() if k != "finalizers"}
        h.claim = self.sim.update({**h.claim, "metadata": meta, "status": status})
        t = time.time()
        spec = {k: v for k, v in h.pod["spec"].items() if k != "nodeName"}
        h.pod = self.sim.update(
            {**h.pod, "spec": spec, "status": {"phase": "Pending", "qosClass": "BestEffort"}}
        )
        if h.probe:
            self.probe(t, h.probe[0], h.probe[1], "slices", 0, _written(h.claim))
        self.released.append((time.monotonic(), i))
        self.counts["released"] += 1
        return 2

    def toggle_taint(self) -> int:
        name = self.rng.choice(self.taintable)
        s = self.sim.get("ResourceSlice", None, name)
        assert s is not None
        devices = [dict(d) for d in s["spec"]["devices"]]
        d = self.rng.choice(devices)
        on = not d.get("taints")
        if on:
            d["taints"] = [dict(TAINT)]
        else:
            d.pop("taints", None)
        self.sim.update({**s, "spec": {**s["spec"], "devices": devices}})
        self.probe(
            time.time(),
            s["spec"]["nodeName"],
            int(d["name"][4:]),
            "tainted",
            int(on),
            ["ResourceSlice", name],
        )
        self.counts["taints"] += 1
        return 1

    def step(self) -> int:
        if self.released and time.monotonic() - self.released[0][0] >= HOLD_SECONDS:
            return self._reallocate(self.released.popleft()[1])
        if self.rng.random() < TAINT_SHARE:
            return self.toggle_taint()
        i = self.order[self.next % len(self.order)]
        self.next += 1
        return self.release(i)

    def _reallocate(self, i: int) -> int:
        h = self.held[i]
        claim, pod = h.original
        h.claim = self.sim.update(claim)
        t = time.time()
        h.pod = self.sim.update(pod)
        if h.probe:
            self.probe(t, h.probe[0], h.probe[1], "slices", 7, _written(h.claim))
        self.counts["reallocated"] += 1
        return 2

    def run(self, rate: float, seconds: float, between: Any = None) -> None:
        """``between``: called every tick, so commands (an API server restart) run during the churn."""
        start = time.monotonic()
        base = self.counts["events"]  # the counts add up over runs: each run has its own rate
        while (elapsed := time.monotonic() - start) < seconds:
            target = base + int(rate * elapsed)
            while self.counts["events"] < target:
                self.counts["events"] += self.step()
            self.probes.flush()
            if between is not None:
                between()
            time.sleep(TICK)
        # Give every released claim its device back, so the fleet ends as it started.
        while self.released:
            self.counts["events"] += self._reallocate(self.released.popleft()[1])
        self.probes.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--preset", default="L", choices=sorted(CLAIMS))
    args = parser.parse_args()
    run_dir = Path(args.dir)
    t0 = time.perf_counter()
    sim, held, taintable = build(args.preset)
    gc.collect()
    gc.freeze()  # a long-lived fleet: keep full collections from walking it
    server = SimulatorAPIServer(sim, secrets.token_urlsafe(24))
    server.serve_in_thread()
    tmp = run_dir / "kubeconfig.tmp"
    server.write_kubeconfig(tmp)
    os.replace(tmp, run_dir / "kubeconfig")
    counts = {
        kind: len(sim.list(kind)[0])
        for kind in ("Node", "ResourceSlice", "ResourceClaim", "Pod", "DeviceClass")
    }
    (run_dir / "sim.json").write_text(
        json.dumps({"build_seconds": time.perf_counter() - t0, "counts": counts})
    )
    print(f"simulator ready at {server.url} in {time.perf_counter() - t0:.1f}s: {counts}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    churn = Churn(sim, held, taintable, run_dir)
    servers = [server]

    def restart_if_asked() -> None:
        restart = run_dir / "restart.go"
        if not restart.exists():
            return
        # An API server restart whose etcd compacted meanwhile: every open watch ends, the server is
        # away for ``down`` seconds, and every resume from an older resourceVersion gets 410 Gone.
        params = json.loads(restart.read_text())
        restart.unlink()
        port = servers[0].server_address[1]
        servers[0].stop()
        time.sleep(float(params.get("down", 3)))
        sim.compact()
        servers[0] = SimulatorAPIServer(sim, servers[0].token, port=port)
        servers[0].serve_in_thread()
        (run_dir / "restart.done").write_text(json.dumps({"t": time.time()}))

    while not stop.wait(0.1):
        go = run_dir / "churn.go"
        if go.exists():
            params = json.loads(go.read_text())
            go.unlink()
            t = time.time()
            churn.run(float(params["rate"]), float(params["seconds"]), restart_if_asked)
            done = {
                **churn.counts,
                "started": t,
                "ended": time.time(),
                "resource_version": sim.resource_version,
            }
            # Whole or not at all: the bench reads it as soon as it exists.
            (run_dir / "churn.done.tmp").write_text(json.dumps(done))
            os.replace(run_dir / "churn.done.tmp", run_dir / "churn.done")
        restart_if_asked()
        change = run_dir / "change.go"
        if change.exists():
            change.unlink()
            churn.toggle_taint()
            churn.probes.flush()
            (run_dir / "change.done").write_text(json.dumps({"t": time.time()}))
    servers[0].stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
