"""Forwarded headers (X-Forwarded-For/-Proto) are believed only from TRUSTED_PROXIES: claimscope runs as a
real uvicorn process with the command line of k8s/base/web.yaml, and the tests spoof the headers from
127.0.0.1 (uvicorn's own default would believe them from there)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
import yaml
from django.contrib.auth import get_user_model
from django.db import connection

from tests.fleet_pages.server import free_port
from tests.security.test_oidc import parse

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery staple"
SERVER_NAME = "claimscope-proxy-test"


def web_command() -> list[str]:
    """The web container's command in the shipped manifests."""
    docs = list(yaml.safe_load_all((ROOT / "k8s/base/web.yaml").read_text()))
    web = next(d for d in docs if d and d["kind"] == "Deployment")
    (container,) = [c for c in web["spec"]["template"]["spec"]["containers"] if c["name"] == "web"]
    return list(container["command"])


@contextmanager
def claimscope(tmp_path: Path, **env: str) -> Iterator[tuple[str, Path]]:
    db = connection.settings_dict
    port = free_port()
    args = [a for a in web_command() if not a.startswith(("--host", "--port"))]
    assert args[0] == "uvicorn" and "--no-proxy-headers" in args, args
    args = [sys.executable, "-m", *args, "--host=127.0.0.1", f"--port={port}", "--log-level=warning"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CLAIMSCOPE_"))}
    environ |= {
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        f"?application_name={SERVER_NAME}",
        "SECURE_COOKIES": "0",
        "LOG_LEVEL": "INFO",
        **env,
    }
    log = tmp_path / f"claimscope-{secrets.token_hex(4)}.log"
    base = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        process = subprocess.Popen(args, cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                pytest.fail(f"claimscope exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                requests.get(f"{base}/healthz", timeout=2)
                break
            except requests.ConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail("claimscope did not answer within 60 s")
                time.sleep(0.2)
        yield base, log
    finally:
        process.terminate()
        process.wait(10)
        with connection.cursor() as cur:
            cur.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = %s",
                [SERVER_NAME],
            )


def login(base: str, password: str, headers: dict[str, str] | None = None) -> requests.Response:
    browser = requests.Session()
    page = browser.get(f"{base}/accounts/login/", timeout=10)
    data = parse(page.text).fields | {"username": "alice", "password": password}
    headers = {"Referer": f"{base}/accounts/login/", **(headers or {})}
    url = f"{base}/accounts/login/"
    return browser.post(url, data=data, headers=headers, timeout=10, allow_redirects=False)


@pytest.fixture
def alice():
    return get_user_model().objects.create_user("alice", password=PASSWORD)


def test_by_default_a_spoofed_forwarded_for_does_not_lift_the_lockout(alice, tmp_path, settings):
    with claimscope(tmp_path) as (base, log):
        for n in range(settings.AXES_FAILURE_LIMIT):
            login(base, "wrong", {"X-Forwarded-For": f"10.0.0.{n}"})
        assert login(base, PASSWORD).status_code == 429
        for spoofed in ("10.9.9.9", "10.9.9.9, 10.9.9.8", "127.0.0.2"):
            assert login(base, PASSWORD, {"X-Forwarded-For": spoofed}).status_code == 429, spoofed
        assert login(base, PASSWORD, {"Forwarded": "for=10.9.9.9"}).status_code == 429
        text = log.read_text()
    assert "login failed: username='alice' ip=127.0.0.1 " in text and "10.0.0." not in text


def test_by_default_a_spoofed_forwarded_proto_is_not_believed(alice, tmp_path):
    # Believed, it would make the request https, where Django's CSRF check also wants a same-origin Referer.
    with claimscope(tmp_path) as (base, _):
        response = login(base, PASSWORD, {"X-Forwarded-Proto": "https", "Referer": ""})
    assert response.status_code == 302


def test_a_trusted_proxy_names_the_client_and_the_lockout_keys_on_it(alice, tmp_path, settings):
    with claimscope(tmp_path, TRUSTED_PROXIES="127.0.0.1") as (base, log):
        for _ in range(settings.AXES_FAILURE_LIMIT):
            login(base, "wrong", {"X-Forwarded-For": "203.0.113.5"})
        assert login(base, PASSWORD, {"X-Forwarded-For": "203.0.113.5"}).status_code == 429
        # A client's own X-Forwarded-For is kept by the proxy, which appends the real address: the
        # rightmost address not of a trusted proxy counts.
        assert login(base, PASSWORD, {"X-Forwarded-For": "10.9.9.9, 203.0.113.5"}).status_code == 429
        assert login(base, PASSWORD, {"X-Forwarded-For": "198.51.100.7"}).status_code == 302
        # The proxy's scheme is believed: https, then Django's CSRF check wants a same-origin Referer.
        assert login(base, PASSWORD, {"X-Forwarded-Proto": "https", "Referer": ""}).status_code == 403
        text = log.read_text()
    assert "login failed: username='alice' ip=203.0.113.5 " in text


def test_another_proxy_list_does_not_trust_localhost(alice, tmp_path, settings):
    with claimscope(tmp_path, TRUSTED_PROXIES="10.0.0.0/8") as (base, _):
        for _ in range(settings.AXES_FAILURE_LIMIT):
            login(base, "wrong", {"X-Forwarded-For": "203.0.113.5"})
        assert login(base, PASSWORD, {"X-Forwarded-For": "198.51.100.7"}).status_code == 429


@pytest.mark.parametrize("value", ["*", "proxy.example.com", "10.0.0.0/33"])
def test_trusted_proxies_must_be_addresses_or_networks(value):
    from dashboard.env import ConfigError, env_networks

    with pytest.raises(ConfigError, match="TRUSTED_PROXIES"):
        env_networks("TRUSTED_PROXIES", {"TRUSTED_PROXIES": value})
    assert env_networks("TRUSTED_PROXIES", {"TRUSTED_PROXIES": " 10.1.2.3, fd00::/8"}) == [
        "10.1.2.3/32",
        "fd00::/8",
    ]
