"""`make demo` on its embedded defaults: it serves the login page and, after login, a non-empty fleet."""

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_make_demo_serves_a_live_fleet(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    env["CLAIMSCOPE_DATA_DIR"] = str(tmp_path)
    log = (tmp_path / "demo.log").open("w+")
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "demo", f"PORT={port}"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def login_line():
            text = (tmp_path / "demo.log").read_text()
            return re.search(r"claimscope demo: (\S+)\s+login: (\S+) / (\S+)", text)

        match = wait_for(login_line, 60, "the demo to print its URL and login")
        assert match.group(1) == base + "/"
        user, password = match.group(2), match.group(3)

        def login_page():
            try:
                return requests.get(base + "/accounts/login/", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_for(login_page, 30, "the login page")
        session = requests.Session()
        page = session.get(base + "/accounts/login/", timeout=5)
        found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert found, page.text[:500]
        token = found.group(1)
        response = session.post(
            base + "/accounts/login/",
            data={"username": user, "password": password, "csrfmiddlewaretoken": token},
            headers={"Referer": base + "/accounts/login/"},
            timeout=5,
        )
        assert response.status_code == 200 and "Physical GPUs by model" in response.text
        counted = re.search(r"(\d+) devices", response.text)
        assert counted and int(counted.group(1)) > 100
        assert "B200" in response.text and "1g.10gb" in response.text
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("make demo did not stop on Ctrl-C within 20 s") from None
        log.close()
    assert proc.returncode in (0, 2, -signal.SIGINT, 130), (tmp_path / "demo.log").read_text()[-2000:]
