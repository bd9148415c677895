"""The documented production environment passes `check --deploy`, serves the security headers over HTTPS,
and DEBUG cannot be switched on in production."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
HOST = "claimscope.example.com"


def documented_production_env() -> dict[str, str]:
    """The block after ``<!-- production-env -->`` in docs/operations.md, placeholders filled in."""
    text = OPERATIONS.read_text()
    block = re.search(r"<!-- production-env -->\s*```\w*\n(.*?)```", text, re.S)
    assert block, "docs/operations.md lost its production environment block"
    env = {}
    for line in block.group(1).splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            env[name.strip()] = value.strip()
    # Placeholders (<...>) become real values; the rest is used as documented.
    database = urlparse(os.environ.get("DATABASE_URL", "postgres://claimscope@127.0.0.1:55432/x"))
    fill = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        # The maintenance database always exists: the health check below needs a reachable one.
        "DATABASE_URL": database._replace(path="/postgres").geturl(),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:56379/2"),
    }
    return {name: fill.get(name, value) if "<" in value else value for name, value in env.items()}


def run_django(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "PYTHONPATH")}
    return subprocess.run(
        [sys.executable, *args] if not code else [sys.executable, "-c", code],
        cwd=ROOT,
        env={**keep, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_documented_production_environment_passes_check_deploy():
    env = documented_production_env()
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS"} <= set(env)
    result = run_django("", env, "manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_check_deploy_fails_when_production_is_served_over_plain_http():
    # The check is not vacuous: the test setting (SECURE_COOKIES=0) drops HTTPS-only cookies and HSTS.
    env = {**documented_production_env(), "SECURE_COOKIES": "0"}
    result = run_django("", env, "manage.py", "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stderr + result.stdout


@pytest.mark.parametrize("value", ["1", "true", "on"])
def test_debug_refuses_to_start_in_production(value):
    env = {**documented_production_env(), "DJANGO_DEBUG": value}
    result = run_django("", env, "manage.py", "check")
    assert result.returncode != 0
    assert "DJANGO_DEBUG" in result.stderr and "production" in result.stderr


PROBE = f"""
import json, django
django.setup()
from django.test import Client

def seen(response):
    return {{"status": response.status_code, "headers": dict(response.headers),
             "body": response.content.decode()[:200],
             "cookies": {{k: {{"secure": bool(m["secure"]), "httponly": bool(m["httponly"])}}
                         for k, m in response.cookies.items()}}}}

client = Client()
out = {{
    # secure=True: the scheme a trusted proxy's X-Forwarded-Proto gives (dashboard.security, ASGI level).
    "https": seen(client.get("/accounts/login/", HTTP_HOST="{HOST}", secure=True)),
    "http": seen(client.get("/accounts/login/", HTTP_HOST="{HOST}")),
    "probe": seen(client.get("/healthz", HTTP_HOST="10.1.2.3:8000")),
    "other_host": seen(client.get("/accounts/login/", HTTP_HOST="evil.example.net", secure=True)),
}}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def served() -> dict:
    result = run_django(
        PROBE, {**documented_production_env(), "DJANGO_SETTINGS_MODULE": "dashboard.settings"}
    )
    assert result.returncode == 0, result.stderr
    answer: dict = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def test_pages_carry_hsts_csp_and_frame_denial_over_https(served):
    https = served["https"]
    assert https["status"] == 200
    headers = https["headers"]
    assert headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "same-origin"
    csp = dict(part.strip().split(" ", 1) for part in headers["Content-Security-Policy"].split(";"))
    assert csp["default-src"] == "'self'"
    assert csp["script-src"] == "'self'"  # no inline script, no eval, no CDN
    assert csp["frame-ancestors"] == "'none'"
    assert csp["object-src"] == "'none'"
    assert https["cookies"]["csrftoken"] == {"secure": True, "httponly": False}


def test_plain_http_is_redirected_to_https(served):
    assert served["http"]["status"] == 301
    assert served["http"]["headers"]["Location"] == f"https://{HOST}/accounts/login/"


def test_an_unknown_host_is_refused(served):
    assert served["other_host"]["status"] == 400


def test_the_health_probe_answers_on_the_pod_address_over_plain_http(served):
    # Kubelet and Docker probes use the pod's IP over http: no redirect, no host check.
    assert served["probe"]["status"] == 200
    assert set(json.loads(served["probe"]["body"])) == {"status", "database", "redis", "streams"}
