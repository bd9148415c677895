"""Private PostgreSQL and Redis (ports 55467/56467) and Celery worker subprocesses for the worker tests.

These tests restart Redis and PostgreSQL, so they never touch the shared instances other engineers use:
scripts/services.sh starts private ones in a temporary directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[2]
PG_PORT = 55467
REDIS_PORT = 56467
DB_URL = f"postgres://claimscope@127.0.0.1:{PG_PORT}/claimscope"
REDIS_URL = f"redis://127.0.0.1:{REDIS_PORT}/4"


class ServiceError(RuntimeError):
    pass


class PrivateServices:
    """PostgreSQL + Redis in a temporary directory, migrated; ``env()`` for subprocesses using them."""

    def __init__(self, pg_port: int = PG_PORT, redis_port: int = REDIS_PORT) -> None:
        # Another test module may run its own instances at the same time: each picks its ports.
        self.pg_port, self.redis_port = pg_port, redis_port
        self.db_url = f"postgres://claimscope@127.0.0.1:{pg_port}/claimscope"
        self.redis_url = f"redis://127.0.0.1:{redis_port}/4"
        self.dir = Path(tempfile.mkdtemp(prefix="claimscope-h4-services-"))
        self.dir.chmod(0o755)  # PostgreSQL runs as its own user when we are root

    def _script(self, *args: str) -> str:
        env = {
            **os.environ,
            "CLAIMSCOPE_SERVICES_DIR": str(self.dir),
            "CLAIMSCOPE_PG_DATA": str(self.dir / "pg"),
            "CLAIMSCOPE_PG_PORT": str(self.pg_port),
            "CLAIMSCOPE_REDIS_PORT": str(self.redis_port),
        }
        result = subprocess.run(
            ["bash", str(ROOT / "scripts" / "services.sh"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise ServiceError(f"services.sh {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return result.stdout

    def start(self) -> None:
        for port in (self.pg_port, self.redis_port):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    raise ServiceError(f"port {port} is already in use (a leftover private instance?)")
        self._script("start")
        self.manage("migrate", "--noinput")

    def stop(self) -> None:
        subprocess.run(["redis-cli", "-p", str(self.redis_port), "shutdown", "nosave"], capture_output=True)
        result = subprocess.run(self._pg_ctl("-m", "fast", "-w", "stop"), capture_output=True, text=True)
        if result.returncode != 0:
            raise ServiceError(f"pg_ctl stop failed: {result.stderr}")
        shutil.rmtree(self.dir, ignore_errors=True)

    def _pg_ctl(self, *args: str) -> list[str]:
        pg_ctl = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))[-1]
        cmd = [str(pg_ctl), "-D", str(self.dir / "pg"), *args]
        return ["runuser", "-u", "postgres", "--", *cmd] if os.getuid() == 0 else cmd

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "DATABASE_URL": self.db_url,
            "REDIS_URL": self.redis_url,
            "SECRET_KEY": "test-secret-key-for-the-watch-worker-subprocesses-0123456789",
            "SECURE_COOKIES": "0",
            "CLAIMSCOPE_WATCH_TIMEOUT": "8",
            "CLAIMSCOPE_WATCH_LOCK_TTL": "4",
            "CLAIMSCOPE_WATCH_BEAT_SECONDS": "2",
            "CLAIMSCOPE_WATCH_BACKOFF_MAX": "2",
            "CLAIMSCOPE_WATCH_FORBIDDEN_RETRY": "5",
            **extra,
        }

    def manage(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            env=env or self.env(),
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        if args[0] != "verify" and result.returncode != 0:
            raise ServiceError(f"manage.py {' '.join(args)} failed:\n{result.stderr[-3000:]}")
        return result

    def restart_redis(self) -> None:
        """Shut Redis down without saving (its keys are lost, as after a crash) and start it again."""
        subprocess.run(["redis-cli", "-p", str(self.redis_port), "shutdown", "nosave"], capture_output=True)
        self._script("start")

    def restart_postgres(self) -> None:
        cmd = self._pg_ctl("-m", "fast", "-w", "-l", str(self.dir / "pg" / "server.log"), "restart")
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise ServiceError(f"pg_ctl restart failed: {result.stderr}")

    def count(self, cluster: str, table: str) -> int:
        with psycopg.connect(self.db_url.replace("postgres://", "postgresql://")) as conn:
            sql = f"SELECT count(*) FROM {table} t JOIN fleet_cluster c ON c.id = t.cluster_id"
            sql += " WHERE c.name = %s"
            row = conn.execute(sql, (cluster,)).fetchone()
            return int(row[0]) if row else 0


@contextmanager
def private_services(pg_port: int = PG_PORT, redis_port: int = REDIS_PORT) -> Iterator[PrivateServices]:
    """Started and migrated for the caller, stopped after; a start that fails fails the test loudly."""
    svc = PrivateServices(pg_port=pg_port, redis_port=redis_port)
    try:
        svc.start()
    except ServiceError as err:
        with suppress(ServiceError):
            svc.stop()
        pytest.fail(f"private PostgreSQL/Redis did not start: {err}", pytrace=False)
    try:
        yield svc
    finally:
        svc.stop()


class Worker:
    """`celery -A dashboard worker -Q watch -B` in its own process group, logging to a file.

    ``queues="diagnosis", beat=False`` is the diagnosis worker of production, ``queues="celery"`` its
    default-queue worker (history, utilization samples)."""

    def __init__(
        self,
        services: PrivateServices,
        name: str,
        clusters: str,
        log_dir: Path,
        *,
        queues: str = "watch",
        beat: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.log = log_dir / f"worker-{name}.log"
        self.alive_file = log_dir / f"alive-{name}"  # what the manifests' probes read (k8s/base/worker.yaml)
        schedule = log_dir / f"beat-{name}"
        cmd = [
            str(ROOT / ".venv" / "bin" / "celery"),
            "-A",
            "dashboard",
            "worker",
            "-Q",
            queues,
            "-P",
            "threads",
            "-c",
            "12",
            "-n",
            f"{name}@%h",
            *(["-B", "-s", str(schedule)] if beat else []),
            "-l",
            "info",
            "--without-gossip",
            "--without-mingle",
        ]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=services.env(
                    CLAIMSCOPE_CLUSTERS=clusters,
                    CLAIMSCOPE_WORKER_ALIVE_FILE=str(self.alive_file),
                    **(env or {}),
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the whole worker (main process and any children): no chance to ack or clean up."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        """Cold shutdown (SIGQUIT): the test is over, nothing needs handing over."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
