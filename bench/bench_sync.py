"""Benchmark: a full sync (list output -> normalize -> ingest) into PostgreSQL, against a plain COPY.

    DATABASE_URL=postgres://... SECRET_KEY=... .venv/bin/python bench/bench_sync.py fleet [preset [flags]]
    DATABASE_URL=postgres://... SECRET_KEY=... .venv/bin/python bench/bench_sync.py decode
    DATABASE_URL=postgres://... SECRET_KEY=... .venv/bin/python bench/bench_sync.py controlplane [nodes]

``fleet``: the simulator's "L" fleet (5,000 nodes, 40,000 GPUs) plus one allocated claim and one pod per
GPU-sized device (40,000 each), synced with the reflector's relist code (``fleet.kube.reflector.ingest_list``:
normalize + ``ingest.replace_all``) into an empty database, after a small warm-up sync. The kinds are synced
at the same time, each in its own thread with its own database connection, as the watch worker's threads
run a cluster's streams. Per kind: when it was done, the CPU seconds of its Python thread (normalize,
ingest, claim history hook) and of its PostgreSQL backend (read from /proc when the server is local).
Then the same rows are written again with ``COPY ... FROM STDIN`` into the emptied tables, one connection,
table after table: the floor for writing those rows. Targets: sync <= 10 s and <= 3x COPY. Flags:
``compare`` first syncs kind after kind in one thread (the former benchmark), back to back; ``serial``
syncs only that way; ``relist`` also syncs the same lists a second time over the stored rows (what a
relist after a 410 does).

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
import resource
import sys
import threading
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
from simulator import nvidia  # noqa: E402
from simulator.cluster import SimulatedCluster  # noqa: E402
from simulator.spec import build_fleet, preset  # noqa: E402

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


@dataclasses.dataclass
class KindRun:
    """One kind's sync: wall seconds (from the common start in concurrent mode), CPU seconds of the
    Python thread that ran it, and CPU seconds of its PostgreSQL backend (None if not readable)."""

    wall: float
    python_cpu: float
    server_cpu: float | None


def backend_cpu() -> float | None:
    """CPU seconds used so far by this thread's PostgreSQL backend process: readable when the server runs
    on this machine (it does on the dev machine; the figure tells how much of a sync is the server's)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def listing(cluster: Any, kind: str) -> None:
    """The stream's state before its list, as the reflector records it (a first list that finds another
    kind still listing leaves the read model's recompute to it). With a lease as long as the worker's
    heartbeat keeps it through a long list."""
    ingest.cursors.save_state(cluster, kind, "listing", "", 3600)


def sync_kind(cluster: Any, kind: str, items: list[Obj], since: Callable[[], float]) -> KindRun:
    cpu, server = time.thread_time(), backend_cpu()
    ingest_list(cluster, kind, [items], 10**6)
    server_after = backend_cpu()
    server_cpu = None if server is None or server_after is None else server_after - server
    return KindRun(since(), time.thread_time() - cpu, server_cpu)


def sync(cluster: Any, grouped: dict[str, list[Obj]], concurrent: bool = True) -> dict[str, KindRun]:
    """Normalize + ingest every kind with the reflector's relist code.

    ``concurrent`` (what the watch worker does): each kind in its own thread with its own database
    connection, all started together, as the worker's threads run a cluster's streams (``celery -P
    threads``, one stream per (cluster, kind)): the Python work shares one core (the GIL), each COPY
    runs in its own PostgreSQL backend. Otherwise kind after kind in this thread."""
    if not concurrent:
        runs = {}
        for kind in INGEST_ORDER:
            listing(cluster, kind)
            runs[kind] = sync_kind(cluster, kind, grouped.get(kind, []), clock())
        return runs
    start = threading.Barrier(len(INGEST_ORDER))
    since = clock()
    results: dict[str, KindRun | BaseException] = {}

    def stream(kind: str) -> None:
        try:
            listing(cluster, kind)  # every stream lists from the start
            start.wait()
            results[kind] = sync_kind(cluster, kind, grouped.get(kind, []), since)
        except BaseException as exc:  # re-raised in the caller's thread
            results[kind] = exc
        finally:
            connection.close()  # this thread's own connection, as the worker's thread closes it

    threads = [threading.Thread(target=stream, args=(kind,), name=kind) for kind in INGEST_ORDER]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    runs = {}
    for kind in INGEST_ORDER:
        result = results[kind]
        if isinstance(result, BaseException):
            raise result
        runs[kind] = result
    return runs


@contextmanager
def phases() -> Iterator[dict[tuple[str, str], float]]:
    """CPU seconds per (kind, phase) inside the sync: "normalize", and "history" (claims' in-transaction
    history hooks); the rest of a kind's Python CPU is ingest proper (rows, JSON, COPY formatting)."""
    seconds: dict[tuple[str, str], float] = defaultdict(float)
    normalize_many = reflector.normalize_many
    specs = dict(ingest.SPECS)

    # CPU seconds of the calling thread: with kinds in concurrent threads, wall time would also count the
    # time spent waiting for the GIL held by the others.
    def timed_normalize(kind: str, *args: Any) -> Any:
        started = time.thread_time()
        try:
            return normalize_many(kind, *args)
        finally:
            seconds[kind, "normalize"] += time.thread_time() - started

    def timed_hook(kind: str, hook: Callable[..., None]) -> Callable[..., None]:
        def run(*args: Any) -> None:
            started = time.thread_time()
            try:
                hook(*args)
            finally:
                seconds[kind, "history"] += time.thread_time() - started

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


@dataclasses.dataclass
class CopyRun:
    """COPY FROM STDIN of the synced rows: wall seconds and the servers' CPU seconds (None: unreadable)."""

    seconds: float
    server_cpu: float | None


def dump_tables() -> dict[str, bytes]:
    """The synced rows of every table, as COPY text."""
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
    return dumps


def copy_tables(dumps: dict[str, bytes], verbose: bool = False) -> tuple[float, float | None]:
    """COPY FROM STDIN of ``dumps`` on this thread's connection, in one transaction; seconds and the
    backend's CPU seconds."""
    connection.ensure_connection()
    raw = connection.connection
    assert raw is not None
    server = backend_cpu()
    elapsed = clock()
    with transaction.atomic(), raw.cursor() as cur:
        for table, data in dumps.items():
            if not data:
                continue
            started = elapsed()
            with cur.copy(f"COPY {table} FROM STDIN") as copy:
                copy.write(data)
            if verbose:
                lines, megabytes, seconds = data.count(b"\n"), len(data) / 1e6, elapsed() - started
                print(f"  COPY {table:30} {lines:7} rows {megabytes:6.1f} MB {seconds:6.2f}s")
    seconds = elapsed()
    server_after = backend_cpu()
    return seconds, None if server is None or server_after is None else server_after - server


def copy_baseline() -> tuple[int, CopyRun, CopyRun]:
    """Dump the synced rows and time COPY FROM STDIN of the same rows into the emptied tables twice: on one
    connection, table after table; then every table at once, each on its own connection (the floor for a
    sync whose kinds write concurrently: on a loaded machine, several busy backends get a larger share of
    the CPU than one, so comparing a concurrent sync with a one-connection COPY would flatter it)."""
    dumps = dump_tables()
    rows = sum(d.count(b"\n") for d in dumps.values())
    empty_tables()
    serial = CopyRun(*copy_tables(dumps, verbose=True))
    empty_tables()
    results: dict[str, tuple[float, float | None] | BaseException] = {}
    start = threading.Barrier(len(dumps))

    def copy_one(table: str) -> None:
        try:
            start.wait()
            results[table] = copy_tables({table: dumps[table]})
        except BaseException as exc:  # re-raised in the caller's thread
            results[table] = exc
        finally:
            connection.close()

    elapsed = clock()
    threads = [threading.Thread(target=copy_one, args=(table,)) for table in dumps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = elapsed()
    servers: list[float | None] = []
    for result in results.values():
        if isinstance(result, BaseException):
            raise result
        servers.append(result[1])
    server = None if None in servers else sum(s for s in servers if s is not None)
    return rows, serial, CopyRun(seconds, server)


def cpu(seconds: float | None) -> str:
    return "    ?" if seconds is None else f"{seconds:5.2f}"


def report(runs: dict[str, KindRun], parts: dict[tuple[str, str], float]) -> None:
    """Per kind: wall time (done at, from the common start when concurrent), the Python thread's CPU
    split into normalize / ingest / claim history hook, and its PostgreSQL backend's CPU."""
    for kind, run in runs.items():
        normalize, history = parts[kind, "normalize"], parts[kind, "history"]
        detail = (
            f"Python CPU {run.python_cpu:5.2f}s (normalize {normalize:5.2f}, "
            f"ingest {run.python_cpu - normalize - history:5.2f}"
        )
        detail += f", claim history hook {history:.2f})" if history else ")"
        print(f"  {kind:22} {run.wall:6.2f}s: {detail}; server CPU {cpu(run.server_cpu)}s")


def timed_sync(
    cluster: Any, grouped: dict[str, list[Obj]], concurrent: bool
) -> tuple[float, float, float | None]:
    """A full sync (kinds concurrent or one after another), reported; returns its wall seconds, this
    process's CPU seconds and the servers' CPU seconds (None: unreadable)."""
    print(f"{'concurrent' if concurrent else 'serial'} sync; load average {load()}")
    process_cpu = time.process_time()
    total = clock()
    with phases() as parts:
        runs = sync(cluster, grouped, concurrent)
    seconds = total()
    process_cpu = time.process_time() - process_cpu
    report(runs, parts)
    servers = [r.server_cpu for r in runs.values()]
    server = None if None in servers else sum(s for s in servers if s is not None)
    print(
        f"full sync ({'kinds concurrent' if concurrent else 'kind after kind'}) {seconds:.2f}s: "
        f"Python CPU {process_cpu:.2f}s (this process), server CPU {cpu(server)}s; load average {load()}"
    )
    return seconds, process_cpu, server


def peak_rss() -> float:
    """This process's peak resident set so far, in MB (ru_maxrss is in kB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_fleet(
    name: str = "L", relist: bool = False, serial_first: bool = False, serial_only: bool = False
) -> int:
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
    print(f"peak RSS before the sync: {peak_rss():.0f} MB (the lists, the simulator holding them)")
    if serial_first:
        # The former benchmark (kinds one after another), back to back with the concurrent one.
        timed_sync(cluster, grouped, concurrent=False)
        empty_tables()
    sync_seconds, process_cpu, server_cpu = timed_sync(cluster, grouped, concurrent=not serial_only)
    if relist:
        # The same lists again over the stored rows (a relist after a 410): ingest's upsert path, through
        # the fence (the same resourceVersions).
        print("relist over the stored rows:")
        timed_sync(cluster, grouped, concurrent=not serial_only)
    print(f"peak RSS after the sync: {peak_rss():.0f} MB")
    rows, serial, parallel = copy_baseline()
    sync_cpu = process_cpu + server_cpu if server_cpu is not None else None
    for name, run in (("one connection", serial), ("a connection per table", parallel)):
        cpu_ratio = (
            ""
            if sync_cpu is None or not run.server_cpu
            else f"; CPU ratio (sync Python + server / COPY server) {sync_cpu / run.server_cpu:.1f}x"
        )
        print(
            f"COPY of the same {rows} rows, {name}: {run.seconds:.2f}s, server CPU {cpu(run.server_cpu)}s; "
            f"ratio {sync_seconds / run.seconds:.1f}x{cpu_ratio}"
        )
    print(f"load average after: {load()}")
    # The target's ratio: against the stricter of the two floors (on a quiet machine, the parallel one).
    copy_seconds = min(serial.seconds, parallel.seconds)
    ratio = sync_seconds / copy_seconds
    ok = sync_seconds <= TARGET_SECONDS and ratio <= TARGET_RATIO
    print(
        f"full sync {sync_seconds:.2f}s, {ratio:.1f}x the faster COPY: targets <= {TARGET_SECONDS:.0f}s "
        f"and <= {TARGET_RATIO:.0f}x: {'OK' if ok else 'MISSED'}"
    )
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
        flags = args[2:]
        return bench_fleet(
            args[1] if len(args) > 1 else "L",
            relist="relist" in flags,
            serial_first="compare" in flags,
            serial_only="serial" in flags,
        )
    if what == "decode":
        return bench_decode()
    if what == "controlplane":
        return bench_controlplane(int(args[1]) if len(args) > 1 else 500)
    print(f"unknown benchmark {what!r}: fleet, decode or controlplane", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
