"""End to end at fleet scale: the production topology as real processes against the simulated L fleet.

    DATABASE_URL=postgres://claimscope@127.0.0.1:55432/<scratch> REDIS_URL=redis://127.0.0.1:56379/<n> \
        .venv/bin/python bench/bench_e2e.py [--rate 500] [--seconds 120] [--users 20] [--load-seconds 60]
        [--source simulator|controlplane] [--nodes 500] [--threads 16]

The scratch database is dropped and created again, and the Redis database flushed: never point this at
data you keep. Processes (each in its own process group, all stopped at the end, logs in ``--dir``):
the simulator (``bench/e2e/simserver.py``: L fleet, 40,000 claims of which 2,000 pending, 38,000 pods),
``celery worker -Q watch -P threads -c 16``, ``celery worker -Q celery -c 2``, ``celery worker -Q diagnosis -P
threads -c 4``, ``celery beat``, and
``uvicorn dashboard.asgi:application`` on a free port. Phases:

1. initial sync: from spawning the workers to every stream watching with the simulator's object counts
   (and from the first ``watch_stream`` task received, from the worker log); then ``manage.py verify``;
   then the diagnosis worker's start: until a diagnosis run has ended (its first update is the full
   recompute) and none has run for 5 s (the initial lists' updates done), reported as ``first_diagnoses``,
   before the churn begins;
2. churn: ``--rate`` watch events/s for ``--seconds``; a websocket client logged in to ``/ws/fleet/``
   (session cookie, Origin header) timestamps every heatmap cell change; each change the simulator made
   (its write time, ``probes.jsonl``) is matched with the first message showing it: event -> database ->
   websocket latency. Afterwards ``manage.py verify`` (nothing lost in the database) and the client's rows
   against a fresh snapshot (nothing lost on the feed);
3. diagnosis: ``update_diagnoses`` (incremental) and ``recompute_diagnoses`` (full) durations from the
   diagnosis worker's log; per churn probe, the time until its diagnosis was stored and a ``/ws/pending/``
   client was told (target p99 ≤ 2 s at L, issue 18; see ``pending_latencies``); and the first run after a
   single fleet change at a quiet moment;
4. load: ``locust --headless`` with ``--users`` users on pages and the API (``bench/e2e/locustfile.py``);
5. peak RSS per process (``VmHWM``, children included) and the database size.

Every figure is printed with the load average (1 min) when it was taken, and saved to ``results.json``.

``--source controlplane``: the same phases against a real control plane instead of the simulator
(``bench/e2e/cpserver.py``: etcd, kube-apiserver, kube-controller-manager and kube-scheduler from
``tests/controlplane/build.sh``, ``--nodes`` GPU nodes published as the NVIDIA driver does, allocated
claims and running pods written through the API); its churn goes through the API server from ``--threads``
client threads, so ``--rate`` is a ceiling and the achieved rate is what the API server took. Peak memory
is also given per command (``kube-apiserver``, ``etcd``...).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import csv
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
VENV = ROOT / ".venv" / "bin"
CLUSTER = "sim"
KINDS = ("Node", "ResourceSlice", "ResourceClaim", "Pod", "DeviceClass")
Obj = dict[str, Any]


def load() -> float:
    return round(os.getloadavg()[0], 2)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} load {load():.2f}] {text}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------- processes


@dataclass
class Proc:
    role: str
    popen: subprocess.Popen[bytes]
    log: Path
    peak_sampled: dict[int, int] = field(default_factory=dict)  # pid -> max RSS seen (kB)
    names: dict[int, str] = field(default_factory=dict)  # pid -> command name (etcd, kube-apiserver...)


class Topology:
    """The processes of one run; each in its own session, so stopping a role stops its children too."""

    def __init__(self, run_dir: Path, env: dict[str, str]) -> None:
        self.run_dir, self.env = run_dir, env
        self.procs: list[Proc] = []

    def spawn(self, role: str, argv: list[str], extra: dict[str, str] | None = None) -> Proc:
        log = self.run_dir / f"{role}.log"
        out = open(log, "wb")  # noqa: SIM115 (handed to the child)
        popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env={**self.env, **(extra or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        proc = Proc(role, popen, log)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.popen.pid, signal.SIGKILL)
                p.popen.wait()


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process so far, with that of its children that exited (and were waited
    for): a PostgreSQL backend that ends during the churn (a watch stream reconnecting) would otherwise
    take its CPU, since the sync, out of the second snapshot."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_snapshot(topo: Topology) -> dict[str, float]:
    """CPU seconds so far per role (its processes), of the PostgreSQL server's processes, and of the
    whole machine (busy time of all cores, /proc/stat), for the CPU split of the churn."""
    out = {p.role: sum(cpu_seconds(pid) for pid in descendants(p.popen.pid)) for p in topo.procs}
    postgres = 0.0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/comm") as f:
                if f.read().strip() in ("postgres", "postmaster"):
                    postgres += cpu_seconds(int(entry))
    out["postgresql"] = postgres
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    out["machine busy"] = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle, iowait
    out["wall"] = time.monotonic()
    return out


class MemorySampler(threading.Thread):
    """RSS of every process of every role once a second (peaks of processes that exit before the end)."""

    def __init__(self, topo: Topology) -> None:
        super().__init__(daemon=True)
        self.topo, self.stopping = topo, threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            self.sample()

    def sample(self) -> None:
        for p in self.topo.procs:
            for pid in descendants(p.popen.pid):
                peak = max(status_kb(pid, "VmHWM"), status_kb(pid, "VmRSS"))
                p.peak_sampled[pid] = max(p.peak_sampled.get(pid, 0), peak)
                if pid not in p.names:
                    p.names[pid] = process_name(pid)


# ------------------------------------------------------------------------------------------- database


def reset_services(database_url: str, redis_url: str) -> None:
    import psycopg
    import redis

    url = urlparse(database_url)
    name = url.path.lstrip("/")
    if not name.startswith("claimscope_"):
        raise SystemExit(f"refusing to drop database {name!r}: use a scratch database named claimscope_*")
    admin = url._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    redis.Redis.from_url(redis_url).flushdb()


def django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
    import django

    django.setup()


def session_cookie() -> str:
    """A logged-in session of the benchmark user (superuser: sees every namespace), as a browser has."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(
        username="bench-e2e", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    return str(client.cookies["sessionid"].value)


def cursors() -> dict[str, tuple[str, int, int]]:
    from fleet.models import WatchCursor

    rows = WatchCursor.objects.filter(cluster__name=CLUSTER).values_list(
        "kind", "state", "object_count", "resource_version"
    )
    return {kind: (state, count, int(rv)) for kind, state, count, rv in rows}


def database_size() -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_database_size(current_database())")
        total = cur.fetchone()[0]
        cur.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid), n_live_tup FROM pg_class c "
            "JOIN pg_stat_user_tables s ON s.relid = c.oid ORDER BY 2 DESC LIMIT 12"
        )
        tables = [{"table": r[0], "bytes": r[1], "rows": r[2]} for r in cur.fetchall()]
    return {"bytes": total, "tables": tables}


def manage(env: dict[str, str], *args: str, timeout: float = 900) -> tuple[int, float, str]:
    t = time.perf_counter()
    done = subprocess.run(
        [str(VENV / "python"), "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, time.perf_counter() - t, (done.stdout + done.stderr)[-3000:]


# ------------------------------------------------------------------------------------------- websocket


class WsClient(threading.Thread):
    """A logged-in websocket client (session cookie, Origin header) handing each message to ``handle``;
    a failure is kept in ``error``, not raised: the run goes on and says what broke."""

    path = ""

    def __init__(self, port: int, session: str) -> None:
        super().__init__(daemon=True)
        self.port, self.session = port, session
        self.stopping = threading.Event()
        self.error: str | None = None
        self.t0 = 0.0  # when it connected

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception as exc:
            self.error = repr(exc)

    async def _run(self) -> None:
        from websockets.asyncio.client import connect

        self.t0 = time.time()
        async with connect(
            f"ws://127.0.0.1:{self.port}{self.path}",
            origin=f"http://127.0.0.1:{self.port}",  # type: ignore[arg-type]
            additional_headers={"Cookie": f"sessionid={self.session}"},
            max_size=None,
            open_timeout=60,
            ping_timeout=None,
        ) as ws:
            while not self.stopping.is_set():
                try:
                    raw = await asyncio.wait_for(ws.recv(), timeout=0.5)
                except TimeoutError:
                    continue
                self.handle(json.loads(raw), time.time())

    def handle(self, msg: Obj, now: float) -> None:
        raise NotImplementedError


class FeedClient(WsClient):
    """A ``/ws/fleet/`` client that timestamps every heatmap cell change it receives."""

    path = "/ws/fleet/"

    def __init__(self, port: int, session: str) -> None:
        super().__init__(port, session)
        self.rows: dict[str, list[Any]] = {}
        self.cells: dict[tuple[str, int], tuple[int, int]] = {}  # (row, index) -> (slices, tainted)
        self.changes: dict[tuple[str, int], list[tuple[float, int, int]]] = defaultdict(list)
        self.snapshot_at: float | None = None
        self.snapshot_seconds: float | None = None
        self.messages = 0
        self.log: list[tuple[float, str, int, int]] = []  # (received, type, version, rows)
        self.gaps = 0
        self.version = 0

    def handle(self, msg: Obj, now: float) -> None:
        self.messages += 1
        self.log.append((now, str(msg.get("type")), int(msg.get("version", 0)), len(msg.get("rows", {}))))
        if msg.get("type") == "snapshot":
            self.snapshot_at, self.snapshot_seconds = now, now - self.t0
            self.rows = dict(msg["rows"])
            for key, row in self.rows.items():
                for cell in row[4]:
                    self.cells[(key, cell[0])] = (min(cell[1], 7), cell[2] & 1)
        elif msg.get("type") == "delta":
            if msg["version"] != self.version + 1:
                self.gaps += 1
            for key in msg.get("removed", []):
                self.rows.pop(key, None)
            for key, row in msg["rows"].items():
                self.rows[key] = row
                for cell in row[4]:
                    value = (min(cell[1], 7), cell[2] & 1)
                    if self.cells.get((key, cell[0])) != value:
                        self.cells[(key, cell[0])] = value
                        self.changes[(key, cell[0])].append((now, *value))
        self.version = msg.get("version", self.version)


def fresh_snapshot(port: int, session: str) -> dict[str, Any]:
    client = FeedClient(port, session)
    client.start()
    deadline = time.monotonic() + 120
    while client.snapshot_at is None and client.error is None and time.monotonic() < deadline:
        time.sleep(0.2)
    client.stopping.set()
    client.join(5)
    return {"rows": client.rows, "seconds": client.snapshot_seconds, "error": client.error}


class PendingClient(WsClient):
    """A ``/ws/pending/`` client (what an open pending page is) that timestamps every ``changed``
    message: the page refetches its rows on each."""

    path = f"/ws/pending/?cluster={CLUSTER}"

    def __init__(self, port: int, session: str) -> None:
        super().__init__(port, session)
        self.told: list[float] = []
        self.diagnosed: list[tuple[float, float]] = []  # (received, diagnosed_at) of messages with one
        self.hello = False

    def handle(self, msg: Obj, now: float) -> None:
        if msg.get("type") == "hello":
            self.hello = True
        elif msg.get("type") == "changed":
            self.told.append(now)
            if isinstance(msg.get("diagnosed_at"), int | float):
                self.diagnosed.append((now, float(msg["diagnosed_at"])))


def pending_latencies(
    seen: list[tuple[float, float]],
    runs: list[tuple[float, float]],
    told: list[float],
    diagnosed: list[tuple[float, float]] | None = None,
) -> tuple[list[float], int]:
    """Change -> its diagnosis stored and open pending pages told, per probe.

    ``seen``: (written, logged) of each probe the feed showed, ``logged`` the time the diagnosis's change
    log took the probe's change (:func:`logged_at`; the heatmap's time when not found there); ``runs``:
    (end, duration) of the diagnosis tasks; ``told``: when the pending websocket said "changed". The first
    diagnosis run that started after the change was logged applied it (it reads every logged change up to
    its start, a moment after it).

    With ``diagnosed`` ((received, diagnosed_at) of the messages announcing stored diagnoses, in the order
    received): the page was told by the first of them whose diagnoses were stored at or after that run's
    start, that is by that run's commit or a later one's. Without: by the first message of any kind after
    that run's end, an upper bound by what the run does after its commit (the message goes out at the
    commit, before the run's end) and by the window of the ingest changes' messages after it."""
    starts = sorted((end - duration, end) for end, duration in runs)
    start_times = [start for start, _ in starts]
    # The earliest message announcing a commit at or after each time: a suffix minimum over diagnosed_at.
    by_stored = sorted((at, received) for received, at in diagnosed or [])
    first_told = [received for _, received in by_stored]
    for k in range(len(first_told) - 2, -1, -1):
        first_told[k] = min(first_told[k], first_told[k + 1])
    stored_times = [at for at, _ in by_stored]
    out, missed = [], 0
    for written, logged in seen:
        i = bisect.bisect_left(start_times, logged)
        if i == len(starts):
            missed += 1
            continue
        if diagnosed is not None:
            k = bisect.bisect_left(stored_times, starts[i][0])
            if k == len(stored_times):
                missed += 1
                continue
            out.append(first_told[k] - written)
            continue
        j = bisect.bisect_left(told, starts[i][1])
        if j == len(told):
            missed += 1
            continue
        out.append(told[j] - written)
    return out, missed


Logged = dict[tuple[str, str], list[float]]


def change_log(redis_url: str, cluster: str) -> Logged:
    """When the diagnosis's change log (``claims.changelog``, a Redis stream) took each key: (kind, key)
    -> the times of the entries naming it written or deleted, in order (an entry's id is the
    millisecond it was appended, after the batch's commit)."""
    import redis

    from claims import changelog

    client = redis.Redis.from_url(redis_url)
    out: Logged = defaultdict(list)
    after = "-"
    while entries := client.xrange(changelog.stream_key(cluster), min=after, max="+", count=2000):
        for entry_id, fields in entries:
            event = json.loads(fields[b"e"])
            at = int(entry_id.split(b"-")[0]) / 1000
            for key in [*event.get("written", []), *event.get("deleted", [])]:
                out[(str(event.get("kind", "")), key)].append(at)
        after = "(" + entries[-1][0].decode()
    return out


def logged_at(probes: list[list[Any]], shown: list[tuple[float, float]], log: Logged) -> list[float]:
    """Per matched probe (``latencies``' order): when the change log took its change (the first entry
    naming the key it wrote from the millisecond of the write on), bounded by the time the heatmap showed
    it (the log is appended right after the heatmap is told, so a later entry is another write's);
    the heatmap's time for probes without a key or not found."""
    out = []
    for probe, (t, when) in zip(probes, shown, strict=True):
        times = log.get(tuple(probe[5])) if len(probe) > 5 else None
        i = bisect.bisect_left(times, t - 0.001) if times else 0
        out.append(min(times[i], when) if times and i < len(times) else when)
    return out


def latencies(
    probes: list[list[Any]], client: FeedClient
) -> tuple[list[tuple[float, float]], int, list[list[Any]]]:
    """Match each change the fleet source wrote with the first message that shows it.

    A message counts only before the next write of the same value to the same cell: after it, showing the
    value may be that later write's doing. A change undone before any message showed it (released and given
    back within one feed window) is then missed, not matched with the next cycle of the same claim (which
    made a p99 of 169 s out of a few such changes in a 5-minute churn of 500 nodes). Only a message that
    turns the probed part of the cell (its slices, or its taint flag) into the value counts: a taint put on
    and taken off within a window leaves the flag shown off, and the next message changing the cell's
    slices must not count as showing "taint off" (one such match made a 68-s maximum). Returns (written,
    shown) of each matched probe, and how many were missed.
    """
    same: dict[tuple[str, int, str, int], list[float]] = defaultdict(list)
    for t, row, index, what, value, *_ in probes:
        same[(row, index, what, value)].append(t)
    for times in same.values():
        times.sort()
    out, missed, matched = [], 0, []
    for probe in probes:
        t, row, index, what, value = probe[:5]
        later = same[(row, index, what, value)]
        j = bisect.bisect_right(later, t)
        limit = later[j] if j < len(later) else float("inf")
        seen = client.changes.get((row, index), [])
        times = [c[0] for c in seen]
        i = bisect.bisect_left(times, t)
        part = 1 if what == "slices" else 2
        want = value if what == "tainted" else (7 if value else 0)
        for k in range(i, len(seen)):
            when = seen[k][0]
            if when >= limit:
                missed += 1
                break
            # The cell's first change after the snapshot: what it was before is not kept, so it counts.
            turned = k == 0 or seen[k - 1][part] != want
            if seen[k][part] == want and turned:
                out.append((t, when))
                matched.append(probe)
                break
        else:
            missed += 1
    return out, missed, matched


def quantiles(values: list[float], digits: int) -> dict[str, float]:
    """p50, p95, p99 and max of ``values`` (seconds), rounded."""
    out = {f"p{round(q * 100)}_s": round(percentile(values, q), digits) for q in (0.5, 0.95, 0.99)}
    out["max_s"] = round(max(values) if values else float("nan"), digits)
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------------------------------- logs

CELERY_LINE = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+): \w+/[^\]]+\] Task ([\w.]+)\[[^\]]+\] succeeded in ([\d.]+)s"
    r"(?:: (.*))?$",
    re.MULTILINE,
)


def task_runs(log: Path, task: str, include_skipped: bool = True) -> list[tuple[float, float]]:
    """(end time, duration) of every successful run of ``task`` in a Celery worker log. Without
    ``include_skipped``, the diagnosis runs that found their cluster held by another run are left out:
    they return ``{}`` at once and apply nothing (``claims.tasks._single_flight``; the rerun after the
    running one does)."""
    out = []
    for m in CELERY_LINE.finditer(log.read_text(errors="replace")):
        if m.group(2) == task and (include_skipped or (m.group(4) or "").strip() != "{}"):
            end = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((end, float(m.group(3))))
    return out


DIAGNOSIS_TASKS = ("claims.tasks.update_diagnoses", "claims.tasks.recompute_diagnoses")


def diag_idle(log: Path) -> bool:
    """Every diagnosis task (incremental update or full recompute) the worker received has ended."""
    text = log.read_text(errors="replace")
    received = set(re.findall(r"(?:update|recompute)_diagnoses\[([0-9a-f-]+)\] received", text))
    ended = set(
        re.findall(r"(?:update|recompute)_diagnoses\[([0-9a-f-]+)\] (?:succeeded|raised|failed)", text)
    )
    return received <= ended


def diagnosis_runs(log: Path, include_skipped: bool = False) -> list[tuple[float, float]]:
    """(end time, duration) of every diagnosis task run that applied the changes logged before it started,
    updates and full recomputes, in end order. A run skipped because another held the cluster is left out
    (unless ``include_skipped``): counted, it would be taken for the update of the changes logged while the
    running one ran, and the running one's "changed" message for theirs, which understates the latency."""
    return sorted(run for task in DIAGNOSIS_TASKS for run in task_runs(log, task, include_skipped))


def first_received(log: Path, task: str) -> float | None:
    pattern = re.compile(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+): [^\]]+\] Task " + re.escape(task) + r"\[")
    m = pattern.search(log.read_text(errors="replace"))
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else None


# ------------------------------------------------------------------------------------------- phases


def wait_for(what: str, check: Any, timeout: float, every: float = 1.0) -> float:
    t = time.monotonic()
    while not check():
        if time.monotonic() - t > timeout:
            raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)
    return time.monotonic() - t


def wait_for_source(topo: Topology, path: Path, timeout: float) -> float:
    """Waits for the fleet source's answer file; a source that died says so instead of a long timeout."""

    def ready() -> bool:
        if path.exists():
            return True
        check_source(topo)
        return False

    return wait_for(f"{topo.procs[0].role}: {path.name}", ready, timeout, 0.5)


def check_source(topo: Topology) -> None:
    source = topo.procs[0]
    if source.popen.poll() is not None:
        tail = source.log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{source.role} exited with {source.popen.returncode}:\n{tail}")


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def locust(
    port: int,
    session: str,
    users: int,
    seconds: int,
    run_dir: Path,
    env: dict[str, str],
    extra_env: dict[str, str] | None = None,
) -> Obj:
    prefix = run_dir / "locust"
    argv = [
        str(VENV / "locust"),
        "-f",
        str(ROOT / "bench" / "e2e" / "locustfile.py"),
        "--headless",
        "-u",
        str(users),
        "-r",
        str(max(1, users // 4)),
        "-t",
        f"{seconds}s",
        "--host",
        f"http://127.0.0.1:{port}",
        "--csv",
        str(prefix),
        "--only-summary",
    ]
    load_before = load()
    with open(run_dir / "locust.log", "wb") as out:
        subprocess.run(
            argv,
            cwd=ROOT,
            env={**env, "CLAIMSCOPE_BENCH_SESSION": session, **(extra_env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=seconds + 120,
            start_new_session=True,
        )
    rows = []
    with open(f"{prefix}_stats.csv") as f:
        for r in csv.DictReader(f):
            rows.append(
                {
                    "name": r["Name"],
                    "requests": int(r["Request Count"]),
                    "failures": int(r["Failure Count"]),
                    "p50_ms": float(r["50%"] or 0),
                    "p95_ms": float(r["95%"] or 0),
                    "p99_ms": float(r["99%"] or 0),
                    "rps": float(r["Requests/s"] or 0),
                }
            )
    return {
        "users": users,
        "seconds": seconds,
        "load_before": load_before,
        "load_after": load(),
        "rows": rows,
    }


def py_spy(pid: int, seconds: int, out: Path) -> subprocess.Popen[bytes]:
    """Sample ``pid`` (all threads, idle frames left out) into collapsed stacks: ``summarize_profile``."""
    argv = [str(VENV / "py-spy"), "record", "--pid", str(pid), "--duration", str(seconds), "--rate", "50"]
    argv += ["--format", "raw", "--output", str(out), "--nonblocking", "--idle"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=float, default=500.0, help="watch events per second during churn")
    parser.add_argument("--seconds", type=float, default=120.0, help="churn duration")
    parser.add_argument(
        "--preset",
        default="L",
        choices=("L", "XL"),
        help="simulated fleet (--source simulator): L 5,000 nodes / 40,000 claims, XL 15,000 nodes / 120,000",
    )
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--load-seconds", type=int, default=60)
    parser.add_argument("--dir", default=str(ROOT / ".run" / "e2e"))
    parser.add_argument("--port", type=int, default=0, help="uvicorn port (default: a free one)")
    parser.add_argument(
        "--web-workers",
        type=int,
        default=1,
        help="uvicorn worker processes (Django runs a process's views one at a time; default 1)",
    )
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument(
        "--source",
        choices=("simulator", "controlplane"),
        default="simulator",
        help="the simulated L fleet, or a real control plane (bench/e2e/cpserver.py) with --nodes GPU nodes",
    )
    parser.add_argument("--nodes", type=int, default=500, help="GPU nodes published (--source controlplane)")
    parser.add_argument(
        "--threads", type=int, default=16, help="API client threads of the churn (--source controlplane)"
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        help="py-spy the web, watch and diagnosis workers for this many seconds of churn",
    )
    parser.add_argument(
        "--diagnosis-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra argument for the diagnosis worker's celery command (e.g. --diagnosis-arg=-c1)",
    )
    parser.add_argument(
        "--diagnosis-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable for the diagnosis worker only (e.g. MALLOC_ARENA_MAX=2)",
    )
    parser.add_argument(
        "--diagnosis-nice",
        type=int,
        choices=range(20),
        default=0,
        metavar="N",
        help="run the diagnosis worker at this niceness (0-19; 0: as the others), below the watch path",
    )
    args = parser.parse_args()
    # Ctrl-C and SIGTERM take the same path: the ``finally`` below stops every process started. SIGINT is
    # set too because a shell starts background jobs with it ignored.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)

    database_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    if not database_url or not redis_url:
        raise SystemExit("set DATABASE_URL (a scratch claimscope_* database) and REDIS_URL (a scratch db)")
    run_dir = Path(args.dir).resolve()
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    port = args.port or free_port()
    env = {
        **os.environ,
        "SECRET_KEY": os.environ.get("SECRET_KEY") or os.urandom(32).hex(),
        "SECURE_COOKIES": "0",
        "CLAIMSCOPE_DATA_DIR": str(run_dir),
        "STATIC_ROOT": str(run_dir / "static"),
        "CLAIMSCOPE_CLUSTERS": f"{CLUSTER}=kubeconfig:{run_dir / 'kubeconfig'}",
        "CLAIMSCOPE_WATCH_BEAT_SECONDS": "5",  # streams start within 5 s of the beat (default 30 s)
        "CLAIMSCOPE_WARM_HEATMAP": "1",  # as the Compose file and the ConfigMap set it
        "PYTHONUNBUFFERED": "1",
    }
    os.environ.update(env)
    results: Obj = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_start": load(),
        "source": args.source,
        "nodes": args.nodes if args.source == "controlplane" else None,
        "rate": args.rate,
        "seconds": args.seconds,
    }
    reset_services(database_url, redis_url)
    for cmd in (("migrate", "-v0"), ("collectstatic", "--noinput", "-v0")):
        rc, _, out = manage(env, *cmd)
        if rc:
            raise SystemExit(out)
    django_setup()
    session = session_cookie()
    topo = Topology(run_dir, env)
    sampler = MemorySampler(topo)
    try:
        if args.source == "controlplane":
            say(f"starting the control plane and publishing {args.nodes} GPU nodes")
            argv = ["-m", "bench.e2e.cpserver", "--nodes", str(args.nodes), "--threads", str(args.threads)]
            topo.spawn("controlplane", [str(VENV / "python"), *argv, "--dir", str(run_dir)])
        else:
            say(f"starting the simulator ({args.preset} fleet)")
            topo.spawn(
                "simulator",
                [
                    str(VENV / "python"),
                    "-m",
                    "bench.e2e.simserver",
                    "--dir",
                    str(run_dir),
                    "--preset",
                    args.preset,
                ],
            )
        wait_for_source(topo, run_dir / "sim.json", 1800)
        sim = json.loads((run_dir / "sim.json").read_text())
        results["simulator"] = sim
        say(f"simulator ready: {sim}")
        celery = str(VENV / "celery")

        def worker(role: str, queue: str, *pool: str, extra: dict[str, str] | None = None) -> None:
            name = role.removeprefix("worker-")
            argv = [
                celery,
                "-A",
                "dashboard",
                "worker",
                "-Q",
                queue,
                *pool,
                "-n",
                f"{name}-e2e@%h",
                "-l",
                "INFO",
            ]
            if role == "worker-diagnosis" and args.diagnosis_nice:
                argv = ["nice", "-n", str(args.diagnosis_nice), *argv]
            topo.spawn(role, argv, extra)

        t_spawn = time.time()
        # The production topology (docs/operations.md): watch threads, default prefork, one diagnosis process.
        worker("worker-watch", "watch", "-P", "threads", "-c", "16")
        worker("worker-default", "celery", "-c", "2")
        diagnosis_env = dict(item.split("=", 1) for item in args.diagnosis_env)
        results["diagnosis_worker"] = {
            "args": args.diagnosis_arg,
            "env": diagnosis_env,
            "nice": args.diagnosis_nice,
        }
        worker(
            "worker-diagnosis",
            "diagnosis",
            "-P",
            "threads",
            "-c",
            "4",
            *args.diagnosis_arg,
            extra=diagnosis_env,
        )
        topo.spawn("beat", [celery, "-A", "dashboard", "beat", "-s", str(run_dir / "celerybeat-schedule")])
        topo.spawn(
            "web",
            [
                str(VENV / "uvicorn"),
                "dashboard.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-access-log",
                "--workers",
                str(args.web_workers),
            ],
        )
        sampler.start()
        want = sim["counts"]

        def converged() -> bool:
            c = cursors()
            return all(c.get(k, ("", -1, 0))[0] == "watching" and c[k][1] == want[k] for k in KINDS)

        wait_for("the initial sync", converged, 900)
        t_done = time.time()
        t_first = first_received(run_dir / "worker-watch.log", "fleet.tasks.watch.watch_stream")
        sync: Obj = {
            "from_spawn_s": round(t_done - t_spawn, 1),
            "from_first_stream_s": round(t_done - t_first, 1) if t_first else None,
            "load": load(),
        }
        say(f"initial sync: {sync}")
        rc, secs, out = manage(env, "verify", "--cluster", CLUSTER)
        sync["verify_rc"], sync["verify_s"] = rc, round(secs, 1)
        sync["verify_tail"] = out[-400:]
        results["sync"] = sync
        say(f"verify after sync: rc={rc} in {secs:.1f}s")

        # ---- churn with a websocket client watching
        client = FeedClient(port, session)
        client.start()
        pending_client = PendingClient(port, session)
        pending_client.start()
        wait_for("the websocket snapshot", lambda: client.snapshot_at is not None or client.error, 300, 0.2)
        wait_for("the pending websocket", lambda: pending_client.hello or pending_client.error, 120, 0.2)
        if client.error:
            raise SystemExit(f"websocket client failed: {client.error}")
        say(f"websocket snapshot: {len(client.rows)} rows in {client.snapshot_seconds:.2f}s")
        results["ws_snapshot_s"] = round(client.snapshot_seconds or 0, 2)
        # The diagnosis worker's start (its first full diagnosis, then the initial lists' relists) is a
        # start-up cost like the sync, measured here on its own: the churn's latencies are those of a
        # running worker, not of one still loading the fleet (at XL that took over two minutes).
        diag_log = run_dir / "worker-diagnosis.log"
        idle_since: list[float | None] = [None]

        def settled() -> bool:
            # A run ended (the worker's first update is its full recompute) and nothing ran for 5 s: a
            # run's follow-up (the rerun of changes logged meanwhile) is received a moment after it ends.
            if not diagnosis_runs(diag_log) or not diag_idle(diag_log):
                idle_since[0] = None
                return False
            since = idle_since[0] = idle_since[0] or time.monotonic()
            return time.monotonic() - since >= 5

        started = wait_for("the first diagnoses", settled, 1800, 1.0)
        results["first_diagnoses"] = {
            "after_sync_s": round(time.time() - t_done, 1),
            "waited_s": round(started, 1),
            "runs_s": [round(d, 1) for _, d in diagnosis_runs(diag_log)],
            "load": load(),
        }
        say(f"first diagnoses: {results['first_diagnoses']}")
        time.sleep(3)
        load_churn = [load()]
        (run_dir / "churn.go").write_text(json.dumps({"rate": args.rate, "seconds": args.seconds}))
        say(f"churn: {args.rate:.0f} events/s for {args.seconds:.0f}s")
        cpu_before = cpu_snapshot(topo)
        spies = []
        if args.profile:
            time.sleep(10)  # into the steady state
            for p in topo.procs:
                if p.role in ("web", "worker-watch", "worker-diagnosis"):
                    spies.append(py_spy(p.popen.pid, args.profile, run_dir / f"profile-{p.role}.txt"))
        while not (run_dir / "churn.done").exists():
            check_source(topo)
            time.sleep(5)
            load_churn.append(load())
        churn = json.loads((run_dir / "churn.done").read_text())
        cpu_after = cpu_snapshot(topo)
        results["cpu_during_churn_s"] = {
            k: round(cpu_after[k] - v, 1) for k, v in cpu_before.items() if k in cpu_after
        }
        say(f"CPU seconds during the churn: {results['cpu_during_churn_s']}")
        for spy in spies:
            spy.wait()
        say(f"churn done: {churn}")

        # Caught up: cursors still for 5 s.
        last: list[Any] = [None, time.monotonic()]

        def quiet() -> bool:
            c = cursors()
            if c != last[0]:
                last[0], last[1] = c, time.monotonic()
            return time.monotonic() - last[1] > 5

        catch_up = wait_for("the watchers to catch up", quiet, 600)
        time.sleep(2)
        # ...and nothing lost on the feed: the client's rows equal a new connection's snapshot. The client
        # keeps listening meanwhile: a delta still on its way (the feed lags the database by seconds when
        # the host is loaded) makes them equal on a later try, a lost one never does.
        t_feed = time.monotonic()
        while True:
            fresh = fresh_snapshot(port, session)
            feed_equal = fresh["rows"] == client.rows
            if feed_equal or time.monotonic() - t_feed > 90:
                break
            time.sleep(3)
        feed_equal_after = time.monotonic() - t_feed
        client.stopping.set()
        client.join(5)
        (run_dir / "ws-messages.json").write_text(json.dumps(client.log))
        # The cell changes the client saw, so the matching can be redone from the files.
        changes = [[row, index, *c] for (row, index), seen in client.changes.items() for c in seen]
        (run_dir / "ws-changes.json").write_text(json.dumps(changes))
        probes = [json.loads(line) for line in (run_dir / "probes.jsonl").read_text().splitlines()]
        shown, missed, shown_probes = latencies(probes, client)
        lat = [when - t for t, when in shown]
        rc, secs, out = manage(env, "verify", "--cluster", CLUSTER)
        results["churn"] = {
            **churn,
            "achieved_rate": round(churn["events"] / (churn["ended"] - churn["started"]), 1),
            "catch_up_after_end_s": round(catch_up, 1),
            "probes": len(probes),
            "matched": len(lat),
            "missed": missed,
            **quantiles(lat, 3),
            "ws_messages": client.messages,
            "ws_version_gaps": client.gaps,
            "ws_rows_equal_fresh": feed_equal,
            "ws_rows_equal_fresh_after_s": round(feed_equal_after, 1),
            "verify_rc": rc,
            "verify_s": round(secs, 1),
            "verify_tail": out[-400:],
            "load_during": load_churn,
            "client_error": client.error,
        }
        say(f"churn results: { {k: v for k, v in results['churn'].items() if k != 'verify_tail'} }")

        # ---- diagnosis
        # At a quiet moment: the recomputations queued by the churn are done first.
        quiet_wait = wait_for("the churn's diagnoses", lambda: diag_idle(diag_log), 1200, 2.0)
        during = diagnosis_runs(diag_log)
        time.sleep(3)  # the last run's "changed" message
        pending_client.stopping.set()
        pending_client.join(5)
        entries = change_log(redis_url, CLUSTER)
        (run_dir / "change-log.json").write_text(json.dumps([[*k, v] for k, v in entries.items()]))
        logged = logged_at(shown_probes, shown, entries)
        told = sorted(pending_client.told)
        from_log = [(t, at) for (t, _), at in zip(shown, logged, strict=True)]
        pending_lat, pending_missed = pending_latencies(from_log, during, told, pending_client.diagnosed)
        # The bounds earlier runs reported: the first message after the applying run's end, and (before
        # 2026-12-07) a run counted only if it started after the heatmap showed the change.
        end_lat, end_missed = pending_latencies(from_log, during, told)
        upper_lat, upper_missed = pending_latencies(shown, during, told)
        (run_dir / "ws-pending.json").write_text(json.dumps(pending_client.told))
        (run_dir / "ws-pending-diagnosed.json").write_text(json.dumps(pending_client.diagnosed))
        full_runs = task_runs(diag_log, "claims.tasks.recompute_diagnoses")
        (run_dir / "change.go").write_text("{}")
        wait_for_source(topo, run_dir / "change.done", 60)
        t_change = json.loads((run_dir / "change.done").read_text())["t"]

        def started_after() -> list[tuple[float, float]]:
            return [(end, d) for end, d in diagnosis_runs(diag_log) if end - d >= t_change]

        wait_for("a diagnosis started after the change", lambda: bool(started_after()), 900)
        after = started_after()
        from fleet.models import ResourceClaim

        pending = ResourceClaim.objects.filter(cluster__name=CLUSTER, state="pending").count()
        results["diagnosis"] = {
            "pending_claims": pending,
            "runs_before": [round(d, 1) for _, d in during],
            # The full recomputes of the run (the diagnosis worker's first update, imports): the
            # baseline the incremental updates replace.
            "full_recomputes_s": [round(d, 1) for _, d in full_runs],
            "waited_for_churn_diagnoses_s": round(quiet_wait, 1),
            # Each heatmap probe of the churn -> its diagnosis stored and /ws/pending/ told, from the time
            # the change log took the change (see pending_latencies).
            "churn_change_to_pending_ws": {
                "matched": len(pending_lat),
                "missed": pending_missed,
                "found_in_change_log": sum(at < when for at, (_, when) in zip(logged, shown, strict=True)),
                **quantiles(pending_lat, 2),
                "ws_messages": len(pending_client.told),
                "client_error": pending_client.error,
            },
            # The same, told by the first message of any kind after the applying run's end (the bound
            # runs before ``diagnosed_at`` gave).
            "churn_change_to_pending_ws_after_run_end": {
                "matched": len(end_lat),
                "missed": end_missed,
                **quantiles(end_lat, 2),
            },
            # ... and from the time the heatmap showed the change (the bound runs before 2026-12-07 gave).
            "churn_change_to_pending_ws_from_heatmap": {
                "matched": len(upper_lat),
                "missed": upper_missed,
                **quantiles(upper_lat, 2),
            },
            "after_change_s": after[0][1],
            "change_to_done_s": round(after[0][0] - t_change, 1),
            "load": load(),
        }
        say(f"diagnosis: {results['diagnosis']}")

        if not args.skip_load:
            say(f"locust: {args.users} users for {args.load_seconds}s")
            extra = {}
            if args.source == "controlplane":
                # The locustfile's node pages name the simulator's nodes; here, some of the published ones.
                from fleet.models import Node

                names = (
                    Node.objects.filter(cluster__name=CLUSTER).order_by("name").values_list("name", flat=True)
                )
                extra["CLAIMSCOPE_BENCH_NODES"] = ",".join(list(names)[::7])
            results["load"] = locust(port, session, args.users, args.load_seconds, run_dir, env, extra)
            for r in results["load"]["rows"]:
                say(
                    f"  {r['name']:45} n={r['requests']:5} fail={r['failures']} p50={r['p50_ms']:.0f}ms "
                    f"p95={r['p95_ms']:.0f}ms"
                )

        sampler.sample()
        memory = {}
        for p in topo.procs:
            peaks = {pid: max(kb, status_kb(pid, "VmHWM")) for pid, kb in p.peak_sampled.items()}
            by_name: dict[str, int] = {}
            for pid, kb in peaks.items():
                name = p.names.get(pid, "?")
                by_name[name] = max(by_name.get(name, 0), round(kb / 1024))
            memory[p.role] = {
                "peak_mb_max_process": round(max(peaks.values(), default=0) / 1024),
                "processes": len(peaks),
                "peak_mb_by_command": by_name,
            }
        results["memory"] = memory
        results["database"] = database_size()
        say(f"memory: {memory}")
        say(f"database: {results['database']['bytes'] / 2**20:.0f} MB")
    finally:
        # A second Ctrl-C must not cut the cleanup short and leave processes behind.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        sampler.stopping.set()
        topo.stop()
        results["load_end"] = load()
        (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
        print(f"results: {run_dir / 'results.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
