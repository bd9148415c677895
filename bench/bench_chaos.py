"""Recovery of the production topology from each fault, under churn (issue 20).

    .venv/bin/python bench/bench_chaos.py [--preset L] [--rate 400] [--phase-seconds 60] [--faults ...]

Real processes on a private PostgreSQL and Redis (``scripts/services.sh`` in a temporary directory,
ports 55490/56490, so restarting them disturbs nobody): the simulated fleet behind the Kubernetes list/watch
protocol (``bench/e2e/simserver.py``), one Celery watch worker with the beat (``-P threads``), and the ASGI
server with a logged-in ``/ws/fleet/`` client that reconnects whenever its socket closes, as the page does.
Each phase runs churn at ``--rate`` events/s, injects one fault a few seconds in, and measures from the
moment the fault is over (the service is back):

* **streams moving**: until every stream's lease was renewed after the fault and every churned kind's
  cursor moved past its value at the fault (``WatchCursor.lease_until`` / ``resource_version``);
* **feed delivering**: until the websocket client received its first delta after the fault;
* **verify**: ``manage.py verify`` once the churn ended and the streams caught up;
* **regressions**: a stream cursor seen moving back (sampled every 0.5 s), outside relists after a 410;
* **duplicates**: rounds refused at the lock (``'busy'``): a second writer that was kept out;
* **log errors**: ERROR/CRITICAL lines and tracebacks of the worker and the web server during the phase;
* **peak memory**: of the watch worker (VmHWM of its processes).

Faults: ``worker-kill`` (SIGKILL of the watch worker, restarted at once as a supervisor would),
``redis-10s`` and ``redis-120s`` (Redis shut down without saving: every key and queued message lost),
``postgres`` (fast restart), ``apiserver`` (the API server away 3 s, its history compacted: 410 on resume),
``worker-term`` (SIGTERM: how long until the worker exits, then restarted). Results go to
``.run/bench-chaos/<timestamp>/result.json`` and are printed as a table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_e2e import VENV, MemorySampler, Topology, free_port, load, say  # noqa: E402
from tests.watch.services import PrivateServices, ServiceError  # noqa: E402

CLUSTER = "sim"
CHURNED = ("ResourceClaim", "Pod")  # the kinds every churn step changes
PG_PORT, REDIS_PORT = 55490, 56490
LOCK_TTL = 10  # the production default (docs/watchers.md)
FAULTS = ("worker-kill", "redis-10s", "postgres", "apiserver", "worker-term", "redis-120s")
ERROR_LINE = re.compile(r"ERROR|CRITICAL|Traceback")


class FeedClient(threading.Thread):
    """A logged-in /ws/fleet/ client that reconnects 1 s after any close (as static/js does) and records
    when each delta arrived and each close/refusal happened."""

    def __init__(self, port: int, cookie: str) -> None:
        super().__init__(daemon=True)
        self.url = f"ws://127.0.0.1:{port}/ws/fleet/"
        self.headers = {"Cookie": f"sessionid={cookie}", "Origin": "http://127.0.0.1"}
        self.deltas: list[float] = []
        self.closes: list[tuple[float, str]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        import websockets

        while not self.stopping.is_set():
            try:
                async with websockets.connect(
                    self.url, additional_headers=self.headers, open_timeout=15
                ) as ws:
                    while not self.stopping.is_set():
                        try:
                            raw = await asyncio.wait_for(ws.recv(), 1.0)
                        except TimeoutError:
                            continue
                        if '"type":"delta"' in str(raw)[:40]:
                            self.deltas.append(time.time())
            except Exception as exc:  # a close, a refusal, a 500: all recorded, then reconnect
                self.closes.append((time.time(), f"{type(exc).__name__}: {str(exc)[:100]}"))
            await asyncio.sleep(1.0)


def session_cookie() -> str:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(
        username="bench-chaos", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


def streams() -> dict[str, tuple[int, float, str]]:
    """kind -> (resourceVersion, lease_until as epoch seconds, state)."""
    from django.db import connection

    from fleet.models import WatchCursor

    try:
        rows = WatchCursor.objects.filter(cluster__name=CLUSTER).values_list(
            "kind", "resource_version", "lease_until", "state"
        )
        return {k: (int(rv), lease.timestamp() if lease else 0.0, state) for k, rv, lease, state in rows}
    except Exception:  # PostgreSQL is the fault being injected
        connection.close()
        return {}


class CursorWatch(threading.Thread):
    """Samples the cursors every 0.5 s: regressions, and the series the recovery times are read from."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, dict[str, tuple[int, float, str]]]] = []
        self.regressions: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        last: dict[str, int] = {}
        while not self.stopping.wait(0.5):
            now, rows = time.time(), streams()
            if not rows:
                continue
            self.samples.append((now, rows))
            for kind, (rv, _, state) in rows.items():
                if kind in last and rv < last[kind] and state not in ("listing",):
                    self.regressions.append(f"{kind} {last[kind]} -> {rv}")
                last[kind] = rv


def moving_again(
    watch: CursorWatch, since: float, before: dict[str, tuple[int, float, str]], lease: float
) -> tuple[float, float] | None:
    """(seconds from ``since`` until every stream's lease was renewed after it and every churned kind's
    cursor moved past ``before``, seconds until the first churned cursor moved)."""
    first_move: float | None = None
    for t, rows in watch.samples:
        if t < since or len(rows) < len(before):
            continue
        moved = [rows[k][0] > before[k][0] for k in CHURNED if k in rows and k in before]
        if any(moved) and first_move is None:
            first_move = t
        # A renewal at time r sets the lease to r + lease: beyond since + lease, it happened after since.
        renewed = all(until > since + lease + 0.5 for _, until, _ in rows.values())
        if renewed and all(moved) and first_move is not None:
            return round(t - since, 1), first_move
    return None


def log_errors(path: Path, offset: int) -> tuple[int, list[str]]:
    text = path.read_text(errors="replace")[offset:] if path.exists() else ""
    lines = [line[:200] for line in text.splitlines() if ERROR_LINE.search(line)]
    return len(lines), lines[:5]


def log_size(path: Path) -> int:
    return len(path.read_text(errors="replace")) if path.exists() else 0


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run_dir = ROOT / ".run" / "bench-chaos" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
        self.run_dir.mkdir(parents=True)
        self.services = PrivateServices(pg_port=PG_PORT, redis_port=REDIS_PORT)
        self.web_port = free_port()

    def env(self) -> dict[str, str]:
        return self.services.env(
            CLAIMSCOPE_CLUSTERS=f"{CLUSTER}=kubeconfig:{self.run_dir / 'kubeconfig'}",
            CLAIMSCOPE_WATCH_TIMEOUT="0",  # production: random 5-10 minute watches
            CLAIMSCOPE_WATCH_LOCK_TTL=str(LOCK_TTL),
            CLAIMSCOPE_WATCH_BEAT_SECONDS="3",
            CLAIMSCOPE_WATCH_BACKOFF_MAX="30",
            CLAIMSCOPE_WATCH_FORBIDDEN_RETRY="300",
            CLAIMSCOPE_WORKER_ALIVE_FILE=str(self.run_dir / "alive"),
        )

    def start_worker(self, name: str) -> Any:
        argv = [str(VENV / "celery"), "-A", "dashboard", "worker", "-Q", "watch", "-P", "threads", "-c", "16"]
        argv += ["-n", f"{name}@%h", "-B", "-s", str(self.run_dir / f"beat-{name}"), "-l", "info"]
        argv += ["--without-gossip", "--without-mingle"]
        return self.topo.spawn(name, argv)

    def main(self) -> dict[str, Any]:
        say(f"private PostgreSQL/Redis on {PG_PORT}/{REDIS_PORT} in {self.services.dir}")
        self.services.start()
        os.environ.update(
            {k: v for k, v in self.env().items() if k in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
        )
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
        import django

        django.setup()
        self.topo = Topology(self.run_dir, self.env())
        sim = self.topo.spawn(
            "simserver",
            [
                str(VENV / "python"),
                "-m",
                "bench.e2e.simserver",
                "--dir",
                str(self.run_dir),
                "--preset",
                self.args.preset,
            ],
        )
        # sim.json is written after the kubeconfig: wait for the last file the simulator writes.
        while not (self.run_dir / "sim.json").exists():
            if sim.popen.poll() is not None:
                raise SystemExit(f"the simulator exited: {sim.log.read_text()[-2000:]}")
            time.sleep(0.5)
        say((self.run_dir / "sim.json").read_text())
        self.worker = self.start_worker("watch")
        self.web = self.topo.spawn(
            "web",
            [
                str(VENV / "uvicorn"),
                "dashboard.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.web_port),
                "--lifespan",
                "off",
                "--timeout-graceful-shutdown",
                "20",
            ],
        )
        sampler = MemorySampler(self.topo)
        sampler.start()
        t = time.time()
        self.wait(
            "the initial sync",
            lambda: len(streams()) == 7 and all(s[2] == "watching" for s in streams().values()),
            1800,
        )
        initial = round(time.time() - t, 1)
        say(f"initial sync {initial}s; worker peak {self.worker_peak_mb(sampler)} MB")
        self.feed = FeedClient(self.web_port, session_cookie())
        self.feed.start()
        self.cursors = CursorWatch()
        self.cursors.start()
        results = {
            "preset": self.args.preset,
            "rate": self.args.rate,
            "initial_sync_s": initial,
            "phases": [],
        }
        try:
            for fault in self.args.faults:
                results["phases"].append(self.phase(fault, sampler))
                say(json.dumps(results["phases"][-1]))
        finally:
            self.cursors.stopping.set()
            self.feed.stopping.set()
            sampler.stopping.set()
            results["worker_peak_mb"] = self.worker_peak_mb(sampler)
            self.topo.stop()
            self.services.stop()
        (self.run_dir / "result.json").write_text(json.dumps(results, indent=2))
        return results

    def worker_peak_mb(self, sampler: MemorySampler) -> int:
        peaks = [kb for p in self.topo.procs if p.role.startswith("watch") for kb in p.peak_sampled.values()]
        return round(max(peaks, default=0) / 1024)

    def wait(self, what: str, check: Any, timeout: float) -> float:
        t = time.monotonic()
        while not check():
            if time.monotonic() - t > timeout:
                raise SystemExit(f"timed out waiting for {what}")
            time.sleep(0.5)
        return time.monotonic() - t

    def churn(self, seconds: float) -> None:
        done = self.run_dir / "churn.done"
        done.unlink(missing_ok=True)
        (self.run_dir / "churn.go").write_text(json.dumps({"rate": self.args.rate, "seconds": seconds}))

    def phase(self, fault: str, sampler: MemorySampler) -> dict[str, Any]:
        say(f"phase {fault}")
        logs = {p.role: (p.log, log_size(p.log)) for p in self.topo.procs if p.role != "simserver"}
        busy_before = sum(
            log_size(p.log) and p.log.read_text(errors="replace").count(": 'busy'")
            for p in self.topo.procs
            if p.role.startswith("watch")
        )
        regressions_before = len(self.cursors.regressions)
        seconds = self.args.phase_seconds
        self.churn(seconds)
        time.sleep(5)
        result: dict[str, Any] = {"fault": fault, "load": load()}
        before: dict[str, tuple[int, float, str]] = {}
        while len(before) < 7:  # the cursors just before the fault (ingest stops, or not, during it)
            before = streams()
        back = self.inject(fault, result)
        moving = self.until(lambda: moving_again(self.cursors, back, before, LOCK_TTL), 300)
        result["streams_moving_s"] = moving[0] if moving else None
        if moving is None:  # say why: the cursors before, at the fault's end and now
            last = self.cursors.samples[-1] if self.cursors.samples else (0.0, {})
            result["not_moving"] = {"since": back, "before": before, "last_sample": last}
        # The feed delivers again with the first delta sent after ingest moved again.
        moved_at = moving[1] if moving else back
        result["feed_delivering_s"] = self.until(
            lambda: next((round(t - back, 1) for t in self.feed.deltas if t > moved_at), None), 300
        )
        self.wait("the churn to end", lambda: (self.run_dir / "churn.done").exists(), seconds + 600)
        time.sleep(5)  # the last batches and the cursors catch up
        code, _, out = self.verify()
        result["verify"] = "in sync" if code == 0 else out.strip().splitlines()[-1][:200]
        result["regressions"] = self.cursors.regressions[regressions_before:]
        busy_after = sum(
            p.log.read_text(errors="replace").count(": 'busy'")
            for p in self.topo.procs
            if p.role.startswith("watch") and p.log.exists()
        )
        result["duplicates_refused"] = busy_after - busy_before
        errors = {role: log_errors(path, offset) for role, (path, offset) in logs.items()}
        result["log_errors"] = {role: n for role, (n, _) in errors.items()}
        result["log_error_samples"] = {role: s for role, (_, s) in errors.items() if s}
        result["feed_closes"] = [c for t, c in self.feed.closes if t > back - 30][:5]
        result["feed_deltas_before_after"] = [
            sum(back - 30 < t < back for t in self.feed.deltas),
            sum(t > back for t in self.feed.deltas),
        ]
        result["worker_peak_mb"] = self.worker_peak_mb(sampler)
        result["load_after"] = load()
        return result

    def until(self, check: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value is not None:
                return value
            time.sleep(0.5)
        return None

    def verify(self) -> tuple[int, float, str]:
        t = time.perf_counter()
        done = subprocess.run(
            [str(VENV / "python"), "manage.py", "verify", "--cluster", CLUSTER],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        return done.returncode, time.perf_counter() - t, done.stdout + done.stderr

    def inject(self, fault: str, result: dict[str, Any]) -> float:
        """Inject ``fault``; returns the time the faulted part was back."""
        if fault == "worker-kill":
            os.killpg(self.worker.popen.pid, signal.SIGKILL)
            self.worker.popen.wait()
            self.worker = self.start_worker(f"watch-{int(time.time())}")
        elif fault == "worker-term":
            t = time.time()
            os.killpg(self.worker.popen.pid, signal.SIGTERM)
            try:
                self.worker.popen.wait(60)
                result["exit_after_sigterm_s"] = round(time.time() - t, 1)
            except subprocess.TimeoutExpired:
                result["exit_after_sigterm_s"] = "still running after 60 s"
                os.killpg(self.worker.popen.pid, signal.SIGKILL)
            self.worker = self.start_worker(f"watch-{int(time.time())}")
        elif fault.startswith("redis-"):
            down = float(fault.split("-")[1].rstrip("s"))
            subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "shutdown", "nosave"], capture_output=True)
            time.sleep(down)
            self.services.restart_redis()
        elif fault == "postgres":
            self.services.restart_postgres()
        elif fault == "apiserver":
            done = self.run_dir / "restart.done"
            done.unlink(missing_ok=True)
            (self.run_dir / "restart.go").write_text(json.dumps({"down": 3}))
            self.wait("the API server to restart", done.exists, 60)
        else:
            raise SystemExit(f"unknown fault {fault!r}")
        return time.time()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="L")
    parser.add_argument("--rate", type=float, default=400)
    parser.add_argument("--phase-seconds", type=float, default=60)
    parser.add_argument("--faults", nargs="+", default=list(FAULTS), choices=FAULTS)
    args = parser.parse_args()
    try:
        results = Bench(args).main()
    except ServiceError as err:
        raise SystemExit(f"private services: {err}") from None
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
