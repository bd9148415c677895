"""The commands and healthchecks of docker-compose.yml really work: the web command serves /healthz to the
web healthcheck, and a watch worker answers the worker healthcheck's ping (run here as plain processes)."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from tests.controlplane.kube import wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def services() -> dict:
    compose: dict = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return compose["services"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def app_env() -> dict[str, str]:
    """Production settings over plain http, on a Redis database of its own so that the worker started here
    consumes no task of another test."""
    redis = urlparse(os.environ.get("REDIS_URL", "redis://127.0.0.1:56379/2"))
    return {
        **os.environ,
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "REDIS_URL": redis._replace(path="/15").geturl(),
        "HOSTNAME": socket.gethostname(),  # what celery's %h expands to, as in a container
    }


def healthcheck(service: dict, replace: dict[str, str]) -> list[str]:
    test = service["healthcheck"]["test"]
    if test[0] == "CMD-SHELL":
        script = test[1].replace("$$", "$")
        for old, new in replace.items():
            script = script.replace(old, new)
        return ["sh", "-c", script]
    return [replace.get(part, part) for part in test[1:]]


def start(command: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=app_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def passes(command: list[str]) -> bool:
    return subprocess.run(command, cwd=ROOT, env=app_env(), capture_output=True, timeout=60).returncode == 0


def test_the_web_command_answers_the_web_healthcheck(services):
    port = str(free_port())
    web = services["web"]
    command = [
        arg.replace("--port=8000", f"--port={port}").replace("0.0.0.0", "127.0.0.1") for arg in web["command"]
    ]
    check = healthcheck(web, {})
    check = [part.replace(":8000/", f":{port}/") for part in check]
    assert not passes(check)  # nothing listens yet: the check can fail
    proc = start(command)
    try:
        wait_for("the web healthcheck to pass", lambda: passes(check), timeout=60, interval=0.5)
    finally:
        stop(proc)


def test_a_watch_worker_answers_the_worker_healthcheck(services):
    worker = services["worker-watch"]
    command = [
        "--concurrency=1" if arg.startswith("--concurrency=") else arg for arg in worker["command"]
    ]  # one process is enough to answer a ping
    check = healthcheck(worker, {})
    assert shlex.split(check[2])[:4] == ["celery", "--app=dashboard", "inspect", "ping"]
    proc = start(command)
    try:
        wait_for("the worker healthcheck to pass", lambda: passes(check), timeout=90, interval=1)
    finally:
        stop(proc)
