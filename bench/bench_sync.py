"""Benchmark: a full sync (list output -> normalize -> ingest) into PostgreSQL, against a plain COPY.

    DATABASE_URL=postgres://... SECRET_KEY=... .venv/bin/python bench/bench_sync.py fleet [preset [relist]]
    DATABASE_URL=postgres://... SECRET_KEY=... .venv/bin/python bench/bench_sync.py decode
    DATABASE_URL=postgres://... SECRET_KEY=... .venv/bin/python bench/bench_sync.py controlplane [nodes]

``fleet``: the simulator's "L" fleet (5,000 nodes, 40,000 GPUs) plus one allocated claim and one pod per
GPU-sized device (40,000 each), synced kind by kind with the reflector's relist code
(``fleet.kube.reflector.ingest_list``: normalize + ``ingest.replace_all``) into an empty database, after a
small warm-up sync. Then the same rows are written again with ``COPY ... FROM STDIN`` into the emptied
tables: the floor for writing those rows. Targets: sync <= 10 s and <= 3x COPY. With ``relist``, the same
lists are also synced a second time over the stored rows (what a relist after a 410 does).

``decode``: ``orjson.loads`` against the ``kubernetes`` client's model deserialization of the same list.

``controlplane``: starts a real control plane, publishes ``nodes`` GPU nodes (default 500), and times a
cold start of every stream (list + normalize + ingest of every kind) against ``kubectl get -o json`` of
the same kinds.

The database named by DATABASE_URL is emptied of fleet and claim rows: use a scratch database.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

import orjson  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from fleet import ingest  # noqa: E402
from fleet.importer import INGEST_ORDER  # noqa: E402
from fleet.kube import reflector  # noqa: E402
from fleet.kube.reflector import ingest_list  # noqa: E402
from fleet.simulator import nvidia  # noqa: E402
from fleet.simulator.cluster import SimulatedCluster  # noqa: E402
from fleet.simulator.spec import build_fleet, preset  # noqa: E402

Obj = dict[str, Any]
TARGET_SECONDS = 10.0
TARGET_RATIO = 3.0


def clock() -> Callable[[], float]:
    start = time.perf_counter()
    return lambda: time.perf_counter() - start


# ----------------------------------------------------------------------------------------- the fleet


def workload(slices: list[Obj], n: int) -> tuple[list[Obj], list[Obj], list[Obj]]:
    """``n`` allocated, reserved claims (one device each, GPUs and MIG slices) with their pods."""
    claims: list[Obj] = []
    pods: list[Obj] = []
    templates = [nvidia.claim_template("ml", "one-gpu", [nvidia.exactly_request("gpu", "gpu.nvidia.com")])]
    devices = (
        (s["spec"]["nodeName"], s["spec"]["pool"]["name"], d["name"])
        for s in slices
        if s["spec"]["driver"] == "gpu.nvidia.com" and s["spec"].get("nodeName")
        for d in s["spec"].get("devices", [])
    )
    for i, (node, pool, device) in zip(range(n), devices, strict=False):
        pod = nvidia.pod_object(
            "ml", f"job-{i}", [("gpu", "one-gpu")], node=node, claim_statuses={"gpu": f"job-{i}-gpu"}
        )
        status = nvidia.allocation_status([{"request": "gpu", "pool": pool, "device": device}], node, [pod])
        claims.append(
            nvidia.claim_object(
                "ml",
                f"job-{i}-gpu",
                [nvidia.exactly_request("gpu", "gpu.nvidia.com")],
                status=status,
                owner_pod=pod,
                pod_claim_name="gpu",
            )
        )
        pods.append(pod)
    return claims, pods, templates


def fleet_objects(name: str) -> dict[str, list[Obj]]:
    fleet = build_fleet(preset(name))
    gpus = sum(fleet.physical_gpus().values())
    claims, pods, templates = workload(fleet.slices, gpus)
    # Through the simulator's API, so every object has the resourceVersion a real list gives it.
    sim = SimulatedCluster(history_limit=1000)
    sim.bulk_create([*fleet.objects(), *templates, *claims, *pods])
    return {kind: sim.list(kind)[0] for kind in INGEST_ORDER}


TABLES = (
    "fleet_deviceclass",
    "fleet_node",
    "fleet_resourceslice",
    "fleet_device",
    "claims_resourceclaimtemplate",
    "claims_resourceclaim",
    "claims_deviceallocation",
    "claims_pod",
    "claims_schedulingevent",
    "claims_claimlifecycle",  # claim history, written by ingest's hook in the claims' transactions
    "claims_claimstatechange",
    "fleet_watchcursor",
)


def empty_tables() -> None:
    with connection.cursor() as cur:
        cur.execute("TRUNCATE " + ", ".join(TABLES) + " CASCADE")


def sync(cluster: Any, grouped: dict[str, list[Obj]]) -> dict[str, float]:
    """Normalize + ingest every kind with the reflector's relist code; seconds per kind."""
    times: dict[str, float] = {}
    for kind in INGEST_ORDER:
        elapsed = clock()
        ingest_list(cluster, kind, grouped.get(kind, []), 10**6)
        times[kind] = elapsed()
    return times


@contextmanager
def phases() -> Iterator[dict[tuple[str, str], float]]:
    """Seconds per (kind, phase) inside the sync: "normalize", and "history" (claims' in-transaction
    history hooks); the rest of a kind's time is ingest proper."""
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    normalize_many = reflector.normalize_many
    specs = dict(ingest.SPECS)

    def timed_normalize(kind: str, *args: Any) -> Any:
        elapsed = clock()
        try:
            return normalize_many(kind, *args)
        finally:
            seconds[kind, "normalize"] += elapsed()

    def timed_hook(kind: str, hook: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any) -> None:
            elapsed = clock()
            try:
                hook(*args)
            finally:
                seconds[kind, "history"] += elapsed()

        return run

    reflector.normalize_many = timed_normalize  # type: ignore[assignment]
    for kind, spec in specs.items():
        hooks: dict[str, Any] = {
            name: timed_hook(kind, getattr(spec, name))
            for name in ("on_written", "on_deleted")
            if getattr(spec, name, None)
        }
        ingest.register(kind, dataclasses.replace(spec, **hooks))
    try:
        yield seconds
    finally:
        reflector.normalize_many = normalize_many
        ingest.SPECS.update(specs)


def warm_up() -> None:
    """A small sync first, into another cluster. A watcher process has loaded its code paths long before
    a large relist (the first change event alone imports Celery's task machinery and opens the channel
    layer: about 0.5 s that the first timed kind would otherwise pay)."""
    sync(ingest.get_or_create_cluster("bench-warmup"), fleet_objects("small"))
    empty_tables()


def copy_baseline() -> tuple[float, int]:
    """Dump the synced rows, empty the tables, and time COPY FROM STDIN of the same rows."""
    dumps: dict[str, bytes] = {}
    raw = connection.connection
    assert raw is not None
    with raw.cursor() as cur:
        for table in TABLES:
            buffer = io.BytesIO()
            with cur.copy(f"COPY {table} TO STDOUT") as copy:
                for chunk in copy:
                    buffer.write(chunk)
            dumps[table] = buffer.getvalue()
    empty_tables()
    rows = sum(d.count(b"\n") for d in dumps.values())
    elapsed = clock()
    with transaction.atomic(), raw.cursor() as cur:
        for table, data in dumps.items():
            if not data:
                continue
            started = elapsed()
            with cur.copy(f"COPY {table} FROM STDIN") as copy:
                copy.write(data)
            lines, megabytes, seconds = data.count(b"\n"), len(data) / 1e6, elapsed() - started
            print(f"  COPY {table:30} {lines:7} rows {megabytes:6.1f} MB {seconds:6.2f}s")
    return elapsed(), rows


def report(times: dict[str, float], parts: dict[tuple[str, str], float]) -> None:
    for kind, seconds in times.items():
        normalize, history = parts[kind, "normalize"], parts[kind, "history"]
        detail = f"normalize {normalize:5.2f}s, ingest {seconds - normalize - history:5.2f}s"
        if history:
            detail += f" (+ claim history hook {history:.2f}s)"
        print(f"  {kind:22} {seconds:6.2f}s: {detail}")


def bench_fleet(name: str = "L", relist: bool = False) -> int:
    if connection.vendor != "postgresql":
        print("error: set DATABASE_URL to a scratch PostgreSQL database", file=sys.stderr)
        return 2
    elapsed = clock()
    grouped = fleet_objects(name)
    devices = sum(len(s["spec"].get("devices", [])) for s in grouped["ResourceSlice"])
    print(
        f"{name}: {len(grouped['Node'])} nodes, {len(grouped['ResourceSlice'])} slices, {devices} devices, "
        f"{len(grouped['ResourceClaim'])} claims, {len(grouped['Pod'])} pods (generated in {elapsed():.1f}s)"
    )
    cluster = ingest.get_or_create_cluster("bench")
    empty_tables()
    warm_up()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    total = clock()
    with phases() as parts:
        times = sync(cluster, grouped)
    sync_seconds = total()
    report(times, parts)
    if relist:
        # The same lists again over the stored rows (a relist after a 410): the upsert path, every row
        # rewritten through the fence (same resourceVersions), children replaced.
        again = clock()
        with phases() as parts:
            report(sync(cluster, grouped), parts)
        print(f"relist over the stored rows {again():.2f}s")
    copy_seconds, rows = copy_baseline()
    ratio = sync_seconds / copy_seconds
    print(
        f"full sync {sync_seconds:.2f}s; COPY of the same {rows} rows {copy_seconds:.2f}s; ratio {ratio:.1f}x"
    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    ok = sync_seconds <= TARGET_SECONDS and ratio <= TARGET_RATIO
    print(f"targets: <= {TARGET_SECONDS:.0f}s and <= {TARGET_RATIO:.0f}x COPY: {'OK' if ok else 'MISSED'}")
    empty_tables()
    return 0 if ok else 1


# ----------------------------------------------------------------------------------------- decoding


def bench_decode() -> int:
    from kubernetes.client import ApiClient

    fleet = build_fleet(preset("medium"))
    claims, pods, _ = workload(fleet.slices, 1600)
    client = ApiClient()
    for kind, items in (("ResourceSlice", fleet.slices), ("ResourceClaim", claims), ("Pod", pods)):
        body = orjson.dumps({"apiVersion": "v1", "kind": f"{kind}List", "metadata": {}, "items": items})
        elapsed = clock()
        orjson.loads(body)
        fast = elapsed()
        model = "V1ResourceSliceList" if kind == "ResourceSlice" else f"V1{kind}List"
        elapsed = clock()
        client.deserialize(body.decode(), model, "application/json")
        slow = elapsed()
        print(
            f"{kind:14} {len(items):5} objects, {len(body) / 1e6:5.1f} MB: orjson {fast * 1000:7.1f} ms, "
            f"client models {slow * 1000:8.1f} ms ({slow / fast:.0f}x slower)"
        )
    return 0


# ----------------------------------------------------------------------------------------- control plane


def publish(cp: Any, nodes: int) -> None:
    from tests.controlplane.publisher import FleetPublisher

    publisher = FleetPublisher(cp.client())
    publisher.device_classes()
    models = ("B200", "H100", "H200", "B300")
    for i in range(nodes):
        mode = "static-mig" if i % 3 == 2 else "full"
        publisher.gpu_node(
            f"gpu-{i:04d}", models[i % 4], mode=mode, layout="balanced" if mode != "full" else None
        )


def bench_controlplane(nodes: int = 500) -> int:
    from fleet.kube.kubesource import KubeSource
    from fleet.kube.reflector import Reflector
    from fleet.kube.streams import STREAM_KINDS
    from tests.controlplane.launcher import ControlPlane

    with ControlPlane() as cp:
        elapsed = clock()
        publish(cp, nodes)
        print(f"published {nodes} GPU nodes in {elapsed():.0f}s")
        cluster = ingest.get_or_create_cluster("bench-cp")
        empty_tables()
        elapsed = clock()
        source = KubeSource.from_kubeconfig(str(cp.kubeconfig))
        for kind in STREAM_KINDS:
            Reflector(cluster, kind, source).relist()
        ours = elapsed()
        plurals = "deviceclasses,nodes,resourceslices,resourceclaimtemplates,resourceclaims,pods,events"
        elapsed = clock()
        cp.kubectl("get", plurals, "-A", "-o", "json")
        kubectl = elapsed()
        slices = ingest.SPECS["ResourceSlice"].model._default_manager.filter(cluster=cluster).count()
        print(
            f"watchers' cold sync (list + normalize + ingest, {slices} slices): {ours:.2f}s; "
            f"kubectl get -o json: {kubectl:.2f}s; ratio {ours / kubectl:.1f}x"
        )
        empty_tables()
    return 0


def main(argv: Iterator[str] | list[str]) -> int:
    args = list(argv)
    what = args[0] if args else "fleet"
    if what == "fleet":
        return bench_fleet(args[1] if len(args) > 1 else "L", relist="relist" in args[2:])
    if what == "decode":
        return bench_decode()
    if what == "controlplane":
        return bench_controlplane(int(args[1]) if len(args) > 1 else 500)
    print(f"unknown benchmark {what!r}: fleet, decode or controlplane", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
