"""Benchmark: utilization sampling on the simulator's "L" fleet (5,000 nodes, 40,000 GPUs) through a real
Prometheus scraping the dcgm-exporter stand-in.

    DATABASE_URL=postgres://.../scratch REDIS_URL=redis://.../N SECRET_KEY=... SECURE_COOKIES=0 \\
        .venv/bin/python bench/bench_usage.py [--reuse] [--rounds N] [--compare CHECKOUT]

``BENCH_USAGE_PROFILE=/tmp/round`` also writes a cProfile of each round (``/tmp/round.0``: devices read,
``/tmp/round.1``: devices kept; the last step's), for ``python -m pstats``.

Targets (issue 19): one sampling round (query + join + write) within 2 s of worker time and 300 MB; the
heatmap's utilization data as fast as its allocation data (warm); the idle report over 7 days within 1 s.
Prometheus's own query time is printed beside ours. Baselines of the same run: the round's Prometheus
queries alone, read and decoded in a fresh process (the floor of any round: ``--floor``); the allocation
heatmap data; reading the week's holding ids (the floor of the idle report). The load average is printed
at the start and the end. The fleet plus synthetic claims (bench_heatmap: ~60% of
whole GPUs held, one in ten claims idle here) goes into the "bench-usage" cluster of DATABASE_URL (a scratch
database: replaced unless --reuse). A private Prometheus (the ``prometheus`` binary, 30 s scrapes) scrapes the
stand-in; each round runs in a fresh process so its peak RSS is the round's own. ``--compare`` runs the
rounds of another checkout (``git archive`` of an earlier commit into a folder) beside ours, against the
same Prometheus and database at the same load: before and after in one run.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")

import django

django.setup()

import requests  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.test import Client  # noqa: E402

from fleet import ingest  # noqa: E402
from fleet.importer import import_objects  # noqa: E402
from fleet.models import Cluster  # noqa: E402
from simulator import dcgm  # noqa: E402
from simulator.cluster import SimulatedCluster  # noqa: E402
from simulator.spec import build_fleet, preset  # noqa: E402

CLUSTER = "bench-usage"
AT = datetime(2026, 3, 9, 9, 0, tzinfo=UTC)


def activity(namespace: str, claim: str, at: datetime) -> float:
    """One claim in ten idles; the rest follow the stand-in's profile for their name."""
    return 0.01 if int(claim.rsplit("-", 1)[1]) % 10 == 0 else dcgm.activity_of(namespace, claim, at)


def fleet_objects() -> tuple[list[Any], list[Any]]:
    from bench.bench_heatmap import synthetic_claims

    fleet = build_fleet(preset("L"))
    return fleet.slices, synthetic_claims(fleet)


def load_fleet(reuse: bool, slices: list[Any], claims: list[Any]) -> None:
    if reuse and Cluster.objects.filter(name=CLUSTER).exists():
        return
    ingest.drop_cluster(CLUSTER)
    t0 = time.perf_counter()
    fleet = build_fleet(preset("L"))
    simulated = SimulatedCluster(history_limit=10)
    simulated.bulk_create(fleet.objects())
    grouped = {kind: simulated.list(kind)[0] for kind in ("DeviceClass", "Node", "ResourceSlice")}
    grouped["ResourceClaim"] = claims
    report = import_objects(ingest.get_or_create_cluster(CLUSTER, "bench_usage: the L preset"), grouped)
    print(f"ingested the L fleet in {time.perf_counter() - t0:.0f} s")
    assert not report.errors, report.errors[:3]


def private_prometheus(folder: Path, target_port: int, port: int) -> subprocess.Popen[bytes]:
    binary = shutil.which("prometheus")
    assert binary, "the prometheus binary is missing: scripts/services.sh start installs it"
    config = {
        "global": {"scrape_interval": "30s", "scrape_timeout": "25s"},
        "scrape_configs": [
            {"job_name": "dcgm", "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}]}
        ],
    }
    (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    return subprocess.Popen(
        [
            binary,
            f"--config.file={folder / 'prometheus.yml'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.tsdb.path={folder / 'data'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(folder / "prometheus.log").open("wb"),
    )


class _Frozen:
    def __init__(self, server: Any) -> None:
        self.server = server
        self.port = server.server_port

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def frozen_exporter(body: bytes) -> _Frozen:
    """Serve one pre-rendered exposition page at /metrics in a thread."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return _Frozen(server)


def wait_for_series(url: str, entities: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            r = requests.get(
                f"{url}/api/v1/query", params={"query": f"count({dcgm.ENGINE_ACTIVE})"}, timeout=30
            )
            result = r.json()["data"]["result"]
            if result and int(float(result[0]["value"][1])) >= entities:
                return
        except (requests.RequestException, KeyError, ValueError):
            pass
        time.sleep(1)
    raise SystemExit(f"Prometheus at {url} did not get the stand-in's {entities} entities in 5 minutes")


def _high_water_mb() -> float:
    """This process's peak RSS (VmHWM): getrusage's maxrss would carry the parent's over fork + exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_high_water() -> None:
    """Start VmHWM over from the current RSS (Linux: ``clear_refs`` value 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def one_round(url: str) -> None:
    """--round: two sampling rounds in this (fresh) process, a minute apart on the sampling clock; prints
    seconds and peak RSS of each. The first reads the fleet's devices (a worker's first round, or one after
    a slice changed), the second finds them kept (a worker's round while the slices are unchanged); the
    peak is reset in between, so each is its own."""
    from django.conf import settings

    from usage.config import PrometheusConfig
    from usage.prometheus import PrometheusSource
    from usage.sampler import sample_cluster
    from usage.tasks import thresholds

    settings.CLAIMSCOPE_IDLE_WINDOW_MINUTES = 1
    cluster = Cluster.objects.get(name=CLUSTER)
    source = PrometheusSource(PrometheusConfig(CLUSTER, url), timeout=60)
    at = datetime.now(UTC)
    out = []
    for n in range(2):
        if n:
            _reset_high_water()
        before = _high_water_mb()
        profile = cProfile.Profile() if os.environ.get("BENCH_USAGE_PROFILE") else None
        cpu0, t0 = time.process_time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        report = sample_cluster(cluster, source, at + timedelta(minutes=n), thresholds())
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if profile is not None:
            # Where the CPU goes, a file per round: BENCH_USAGE_PROFILE=/tmp/p writes /tmp/p.0, /tmp/p.1
            profile.disable()
            profile.dump_stats(f"{os.environ['BENCH_USAGE_PROFILE']}.{n}")
        out.append(
            {
                "ok": report.ok,
                "error": report.error,
                "series": report.series,
                "matched": report.matched,
                "unmatched": report.unmatched,
                "query_s": report.query_seconds,
                "wall_s": wall,
                "cpu_s": cpu,
                "peak_mb": _high_water_mb(),
                "before_mb": before,
            }
        )
    print(json.dumps(out))


def floor(url: str) -> None:
    """--floor: only the round's Prometheus queries, read and decoded (no join, no database), in this
    (fresh) process; prints seconds and peak RSS like --round."""
    from usage.config import PrometheusConfig
    from usage.prometheus import METRICS, SHARDS, PrometheusSource, entity_query

    source = PrometheusSource(PrometheusConfig(CLUSTER, url), timeout=60)
    before = _high_water_mb()
    cpu0, t0 = time.process_time(), time.perf_counter()
    rows = 0
    for metric, shard in ((m, part) for m in METRICS for part in SHARDS):
        # Through the source's own request (its headers, orjson): what a round reads, nothing else.
        rows += len(source._get("/api/v1/query", {"query": entity_query(metric, shard=shard)})["result"])
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    print(
        json.dumps(
            {"rows": rows, "wall_s": wall, "cpu_s": cpu, "peak_mb": _high_water_mb(), "before_mb": before}
        )
    )


def prometheus_eval_ms(url: str, queries: list[str]) -> float:
    """Prometheus's own evaluation time of the queries (``stats=all``), in ms."""
    total = 0.0
    for query in queries:
        body = requests.get(
            f"{url}/api/v1/query", params={"query": query, "stats": "all"}, timeout=120
        ).json()
        total += body["data"].get("stats", {}).get("timings", {}).get("evalTotalTime", 0) * 1000
    return total


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def best_of(n: int, fn: Any) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reuse", action="store_true", help="keep an already ingested bench-usage cluster")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--compare",
        metavar="CHECKOUT",
        help="another checkout of claimscope (e.g. `git archive` of the commit before a change): its rounds "
        "run beside ours, same Prometheus, database and load, for before/after figures of one run",
    )
    parser.add_argument("--round", metavar="PROMETHEUS_URL", help=argparse.SUPPRESS)
    parser.add_argument("--floor", metavar="PROMETHEUS_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.round:
        one_round(args.round)
        return 0
    if args.floor:
        floor(args.floor)
        return 0
    print(f"start: {load()}")
    slices, claims = fleet_objects()
    load_fleet(args.reuse, slices, claims)
    t0 = time.perf_counter()
    series = dcgm.series(slices, claims, [], AT, activity)
    entities = sum(1 for s in series if s.metric == dcgm.ENGINE_ACTIVE)
    took = time.perf_counter() - t0
    print(f"stand-in: {len(series):,} series, {entities:,} GPU/MIG entities (computed in {took:.1f} s)")
    renderer = dcgm.DcgmExporter(lambda: series)
    renderer.start()
    t0 = time.perf_counter()
    body = requests.get(renderer.url, timeout=120).content
    print(f"stand-in scrape: {len(body) / 1e6:.1f} MB rendered in {time.perf_counter() - t0:.1f} s")
    renderer.stop()
    # The values do not change here: serve the rendered page, so Prometheus's scrapes stay far inside
    # their timeout on a loaded machine (what is measured is the round, not the stand-in).
    exporter = frozen_exporter(body)
    with tempfile.TemporaryDirectory(prefix="bench-usage-prom-") as tmp:
        from tests.usage.prom import free_port

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        prom = private_prometheus(Path(tmp), exporter.port, port)
        try:
            wait_for_series(url, entities)
            from usage.prometheus import METRICS, SHARDS, entity_query

            whole = '{__name__=~"' + "|".join(METRICS) + '"}'
            print(
                f"Prometheus's own evaluation: the round's {len(METRICS) * len(SHARDS)} queries "
                f"{prometheus_eval_ms(url, [entity_query(m, shard=p) for m in METRICS for p in SHARDS]):.0f}"
                " ms; every DCGM series "
                f"with all its labels (one query) {prometheus_eval_ms(url, [whole]):.0f} ms"
            )

            def fresh(flag: str, script: str = __file__) -> Any:
                # In the checkout's folder: Celery's Django fixup puts the working directory first on
                # sys.path during django.setup(), so modules imported after it come from there.
                done = subprocess.run(
                    [sys.executable, script, flag, url],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=Path(script).resolve().parents[1],
                )
                return json.loads(done.stdout.strip().splitlines()[-1])

            runs = [("", __file__)]
            if args.compare:
                runs.append((f"{args.compare}: ", str(Path(args.compare) / "bench" / "bench_usage.py")))
            for n in range(args.rounds):
                f = fresh("--floor")
                rounds = [(who, r) for who, script in runs for r in fresh("--round", script)]
                for (who, r), what in zip(rounds, ("devices read", "devices kept") * len(runs), strict=True):
                    assert r["ok"], r["error"]
                    above = (r["peak_mb"] - r["before_mb"]) / max(f["peak_mb"] - f["before_mb"], 1)
                    print(
                        f"{who}round {n + 1}, {what}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} s CPU; "
                        "of which "
                        f"the queries (HTTP: Prometheus + transfer + decode) {r['query_s']:.2f} s; peak RSS "
                        f"{r['peak_mb']:.0f} MB (at its start {r['before_mb']:.0f} MB); "
                        f"{r['series']:,} series, "
                        f"{r['matched']:,} matched, {r['unmatched']} unmatched; round/floor CPU "
                        f"{r['cpu_s'] / f['cpu_s']:.1f}x, memory above start {above:.1f}x"
                    )
                print(
                    f"  floor (the queries read and decoded, nothing else): {f['wall_s']:.2f} s wall, "
                    f"{f['cpu_s']:.2f} s CPU, peak RSS {f['peak_mb']:.0f} MB "
                    f"(at start {f['before_mb']:.0f} MB); "
                    f"{load()}"
                )
        finally:
            prom.terminate()
            prom.wait(30)
            exporter.stop()
    from django.conf import settings

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    user, _ = get_user_model().objects.get_or_create(username="bench-usage", defaults={"is_superuser": True})
    client = Client()
    client.force_login(user)
    for url in ("/usage/gpus.json", "/fleet/heatmap.json"):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        print(f"{url}: {len(response.content) / 1e6:.1f} MB")
    usage_ms = best_of(5, lambda: client.get("/usage/gpus.json"))
    alloc_ms = best_of(5, lambda: client.get("/fleet/heatmap.json"))
    print(f"heatmap data, warm: utilization (/usage/gpus.json) {usage_ms:.0f} ms")
    print(f"heatmap data, warm: allocation (/fleet/heatmap.json) {alloc_ms:.0f} ms")
    print(f"  utilization/allocation {usage_ms / alloc_ms:.2f}x")
    from django.utils import timezone

    from usage import selectors
    from usage.report import idle_report

    idle_ms = best_of(5, lambda: idle_report(since="7d"))
    report = idle_report(since="7d")
    now = timezone.now()
    week = selectors.holdings(now - timedelta(days=7), now)
    ids_ms = best_of(5, lambda: list(week.values_list("id", flat=True)))
    print(
        f"idle report over 7 days: {idle_ms:.0f} ms ({week.count():,} holdings, "
        f"{len(report['claims']):,} idle claims listed); the week's holding ids alone {ids_ms:.0f} ms: "
        f"{idle_ms / ids_ms:.1f}x"
    )
    print(f"end: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
