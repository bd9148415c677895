"""The demo as a user starts it, in a subprocess on its embedded defaults, stopped with Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def demo_running(tmp_path: Path, command: list[str], what: str) -> Iterator[Path]:
    """Run ``command`` (``make demo`` or ``manage.py demo``) in the checkout with no production settings and
    its data in ``tmp_path``; yields the path of its log. On exit it is stopped with Ctrl-C, as a user
    does: not stopping within 20 s, or stopping with an error, fails the test."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    env["CLAIMSCOPE_DATA_DIR"] = str(tmp_path)
    path = tmp_path / "demo.log"
    with path.open("w+") as log:
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield path
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                raise AssertionError(f"{what} did not stop on Ctrl-C within 20 s") from None
    assert proc.returncode in (0, 2, -signal.SIGINT, 130), path.read_text()[-2000:]
