"""Celery workers on the "watch" queue against the real control plane, and the faults they survive.

Workers run as real subprocesses against private PostgreSQL/Redis instances (see services.py), so that
restarting those never disturbs anyone else; convergence is checked with `manage.py verify`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import yaml
from celery import Celery

from tests.controlplane.kube import wait_for
from tests.controlplane.launcher import ControlPlane
from tests.watch.helpers import make
from tests.watch.services import REDIS_URL, ROOT, PrivateServices, Worker, private_services

CONVERGE = 90.0
LOGS = Path(tempfile.gettempdir()) / "claimscope-watch-worker-logs"

pytestmark = pytest.mark.controlplane


@pytest.fixture(scope="module")
def services() -> Iterator[PrivateServices]:
    with private_services() as svc:
        yield svc


@pytest.fixture
def workers(
    services: PrivateServices, control_plane: ControlPlane, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Worker]]:
    """Starts workers for a cluster; their logs stay in LOGS/<test name>/ for a post-mortem."""
    started: list[Worker] = []
    redis.Redis.from_url(REDIS_URL).flushdb()  # our private Redis: no messages left from another test
    log_dir = LOGS / request.node.name
    shutil.rmtree(log_dir, ignore_errors=True)
    log_dir.mkdir(parents=True)

    def start(name: str, cluster: str, **env: str) -> Worker:
        worker = Worker(services, name, f"{cluster}=kubeconfig:{control_plane.kubeconfig}", log_dir, env=env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def converged(services: PrivateServices, cluster: str, cp: ControlPlane) -> str:
    """Waits until `manage.py verify --cluster` finds nothing; returns its output."""
    env = services.env(CLAIMSCOPE_CLUSTERS=f"{cluster}=kubeconfig:{cp.kubeconfig}")
    last: list[str] = []

    def clean() -> str | None:
        result = services.manage("verify", "--cluster", cluster, env=env)
        last[:] = [result.stdout[-2000:] + result.stderr[-2000:]]
        return result.stdout if result.returncode == 0 else None

    try:
        return wait_for(f"{cluster} to converge", clean, timeout=CONVERGE, interval=1.0)
    except TimeoutError as err:
        raise AssertionError(f"{err}; last verify:\n{last[0] if last else ''}") from None

    return wait_for(f"{cluster} to converge", clean, timeout=CONVERGE, interval=1.0)


def create_nodes(kube, prefix: str, n: int) -> threading.Thread:
    thread = threading.Thread(target=lambda: [kube.create(make("Node", f"{prefix}-{i}")) for i in range(n)])
    thread.start()
    return thread


def test_a_worker_killed_mid_batch_is_replaced_and_nothing_is_lost(services, workers, kube, control_plane):
    cluster = "killed"
    first = workers("first", cluster)
    converged(services, cluster, control_plane)
    writer = create_nodes(kube, "k", 300)
    wait_for(
        "part of the batch to be written",
        lambda: 0 < services.count(cluster, "fleet_node") < 300,
        timeout=60,
        interval=0.05,
    )
    first.kill()
    writer.join()
    for i in range(0, 300, 7):
        kube.delete("Node", f"k-{i}")
    second = workers("second", cluster)
    converged(services, cluster, control_plane)
    assert services.count(cluster, "fleet_node") == 300 - len(range(0, 300, 7))
    assert "lapsed stream" in second.output()


def test_two_workers_racing_for_one_stream_leave_one_writer(services, workers, kube, control_plane):
    cluster = "raced"
    one, two = workers("one", cluster), workers("two", cluster)
    converged(services, cluster, control_plane)
    client = Celery(broker=REDIS_URL)
    for _ in range(4):  # duplicates of a running stream: each must find the lock taken
        client.send_task("fleet.tasks.watch.watch_stream", args=[cluster, "Node"], queue="watch")
    create_nodes(kube, "r", 40).join()
    converged(services, cluster, control_plane)
    logs = one.output() + two.output()
    wait_for("the duplicates to be refused", lambda: (one.output() + two.output()).count(": 'busy'") >= 4)
    assert "Traceback" not in logs


def test_a_worker_reconnects_after_a_redis_restart_and_goes_on_consuming(
    services, workers, kube, control_plane
):
    cluster = "redis-restart"
    worker = workers("w", cluster)
    converged(services, cluster, control_plane)
    services.restart_redis()  # every key is lost: locks, queued and unacknowledged messages
    create_nodes(kube, "x", 20).join()
    # Stock kombu fails closing the lost channel ("Unrecoverable error: AttributeError(... 'hostname')")
    # and the worker stops consuming; ours reconnects.
    reconnected = lambda: worker.output().count("Connected to redis://") >= 2  # noqa: E731
    wait_for("the worker to reconnect", reconnected, timeout=60)
    converged(services, cluster, control_plane)
    kube.delete("Node", "x-3")
    # Rounds end every 8 s here (CLAIMSCOPE_WATCH_TIMEOUT) and come back through the queue, so this
    # converges only if the worker consumes again after the restart.
    converged(services, cluster, control_plane)

    # Rounds that ran through the restart may have done the converging: the worker must also take new rounds
    # from the queue after its reconnection (rounds end every 8 s and come back through the queue).
    def round_after_reconnection() -> bool:
        after = worker.output().split("Connected to redis://", 2)[2]
        return re.search(r"Task fleet\.tasks\.watch\.watch_stream\[[^\]]+\] received", after) is not None

    wait_for(
        "a watch round taken from the queue after the reconnection", round_after_reconnection, timeout=60
    )
    assert "Unrecoverable error" not in worker.output()
    assert worker.proc.poll() is None


def test_streams_survive_a_postgresql_restart(services, workers, kube, control_plane):
    cluster = "pg-restart"
    worker = workers("w", cluster)
    converged(services, cluster, control_plane)
    writer = create_nodes(kube, "p", 100)
    services.restart_postgres()
    writer.join()
    converged(services, cluster, control_plane)
    assert services.count(cluster, "fleet_node") == 100
    assert worker.proc.poll() is None


def worker_probe(probe: str) -> list[str]:
    """The exec command of a probe of the watch worker in the Kubernetes manifests."""
    docs = yaml.safe_load_all((ROOT / "k8s" / "base" / "worker.yaml").read_text())
    deployment = next(d for d in docs if d["metadata"]["name"] == "worker-watch")
    return deployment["spec"]["template"]["spec"]["containers"][0][probe]["exec"]["command"]


def test_the_manifests_worker_probes_fail_while_the_consumer_is_frozen(services, workers):
    worker = workers("probed", "probed")
    env = {**os.environ, "CLAIMSCOPE_WORKER_ALIVE_FILE": str(worker.alive_file)}

    def passes(probe: str) -> bool:
        return subprocess.run(worker_probe(probe), env=env, timeout=10).returncode == 0

    wait_for("the worker to start consuming", lambda: passes("startupProbe"), timeout=60)
    assert passes("readinessProbe") and passes("livenessProbe")
    os.killpg(worker.proc.pid, signal.SIGSTOP)  # a frozen worker: alive to its supervisor, consuming nothing
    try:
        long_ago = time.time() - 120  # what two minutes of the frozen consumer leave behind
        os.utime(worker.alive_file, (long_ago, long_ago))
        assert not passes("readinessProbe") and not passes("livenessProbe")
    finally:
        os.killpg(worker.proc.pid, signal.SIGCONT)
    wait_for("the consumer to report again", lambda: passes("livenessProbe"), timeout=30)


def test_a_warm_shutdown_ends_every_round_at_once_and_the_next_worker_resumes(
    services, workers, kube, control_plane
):
    cluster = "warm-stop"
    first = workers("first", cluster, CLAIMSCOPE_WATCH_TIMEOUT="600")  # a round would otherwise last 10 min
    converged(services, cluster, control_plane)
    first.proc.send_signal(signal.SIGTERM)
    first.proc.wait(60)  # raises if a round outlives the shutdown: the watches end only in 10 minutes
    assert "Traceback" not in first.output()
    create_nodes(kube, "w", 10).join()
    workers("second", cluster, CLAIMSCOPE_WATCH_TIMEOUT="600")
    converged(services, cluster, control_plane)
