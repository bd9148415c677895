"""Helpers for tests against the real Prometheus: find it, register a scrape target, wait for its series,
and run a private Prometheus a test may stop and start again."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest
import requests
import yaml

T = TypeVar("T")


def prometheus_url() -> str:
    """PROMETHEUS_URL, checked ready; a missing or dead Prometheus fails the test (never skips it)."""
    url = os.environ.get("PROMETHEUS_URL", "").rstrip("/")
    if not url:
        pytest.fail(
            "PROMETHEUS_URL is not set: start Prometheus with `scripts/services.sh start` and export it"
        )
    try:
        requests.get(f"{url}/-/ready", timeout=5).raise_for_status()
    except requests.RequestException as exc:
        pytest.fail(f"Prometheus at {url} is not ready: {exc}")
    return url


def targets_dir(url: str, job: str) -> Path:
    """The file_sd folder of a scrape job, read from the running Prometheus's own configuration."""
    config = yaml.safe_load(requests.get(f"{url}/api/v1/status/config", timeout=5).json()["data"]["yaml"])
    for scrape in config.get("scrape_configs", []):
        if scrape["job_name"] == job:
            return Path(scrape["file_sd_configs"][0]["files"][0]).parent
    pytest.fail(f"Prometheus at {url} has no scrape job {job!r}: was it started by scripts/services.sh?")


@contextmanager
def target(url: str, job: str, port: int) -> Iterator[str]:
    """Register 127.0.0.1:port with the job, labelled with a fresh ``run`` id (yielded) that queries
    filter on, so concurrent test runs never see each other's series."""
    run = uuid.uuid4().hex[:12]
    folder = targets_dir(url, job)
    path = folder / f"test-{run}.json"
    tmp = folder / f".test-{run}.tmp"
    tmp.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {"run": run}}]))
    tmp.rename(path)  # atomic: Prometheus never reads half a file
    try:
        yield run
    finally:
        path.unlink(missing_ok=True)


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePrometheus:
    """A Prometheus process of the test's own (the shared one must keep running for everyone else)."""

    def __init__(self, folder: Path, scrape_port: int) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail(
                "the prometheus binary is missing: run scripts/services.sh start (apt package prometheus)"
            )
        self.binary = binary
        self.folder = folder
        self.port = free_port()
        (folder / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                    "scrape_configs": [
                        {"job_name": "dcgm", "static_configs": [{"targets": [f"127.0.0.1:{scrape_port}"]}]}
                    ],
                }
            )
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.folder / 'prometheus.yml'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--storage.tsdb.path={self.folder / 'data'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.folder / "prometheus.log").open("ab"),
        )

        def ready() -> bool:
            try:
                return requests.get(f"{self.url}/-/ready", timeout=1).ok
            except requests.RequestException:
                return False

        wait_for(ready, f"the private Prometheus on {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)
            self.process = None
