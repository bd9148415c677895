"""Single sign-on against a real local OpenID Connect issuer (tests/oidc_issuer: django-oauth-toolkit in its
own process, with an RSA key made here), with claimscope itself running as a real server process configured
only through CLAIMSCOPE_OIDC_* variables. The whole authorization-code flow goes over HTTP, as a browser
would."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from jwcrypto import jwk

from fleet.models import NamespaceGrant
from tests.fleet_pages.server import free_port

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[2]
CLIENT_ID = "claimscope-test"
ISSUER_USER = "sam"
ISSUER_PASSWORD = "issuer " + secrets.token_hex(8)


@dataclass(frozen=True)
class Issuer:
    url: str
    client_secret: str
    rp_port: int  # the port claimscope must listen on: its callback URL is registered with the issuer
    data: Path

    def endpoint(self, path: str) -> str:
        return f"{self.url}/{path}"


def _wait_http(url: str, process: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{what} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            requests.get(url, timeout=2, allow_redirects=False)
            return
        except requests.ConnectionError:
            time.sleep(0.2)
    pytest.fail(f"{what} did not answer {url} within 60 s")


@contextmanager
def _process(args: list[str], env: dict[str, str], ready_url: str, log: Path, what: str) -> Iterator[None]:
    """Runs a server process, its output in ``log``, until the block ends."""
    with log.open("wb") as out:
        process = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_http(ready_url, process, log, what)
        yield
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _base_env() -> dict[str, str]:
    # Nothing of the test runner's Django configuration leaks into the servers.
    return {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CLAIMSCOPE_"))}


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Issuer]:
    """The test issuer on a free port, with one user (groups: research) and the claimscope client."""
    data = tmp_path_factory.mktemp("issuer")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (data / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    port, rp_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    secret = secrets.token_urlsafe(32)
    env = _base_env() | {
        "ISSUER_DATA_DIR": str(data),
        "ISSUER_RSA_KEY_FILE": str(data / "key.pem"),
        "ISSUER_URL": f"{url}/o",
        "ISSUER_USERNAME": ISSUER_USER,
        "ISSUER_PASSWORD": ISSUER_PASSWORD,
        "ISSUER_EMAIL": "sam@example.org",
        "ISSUER_GROUPS": "research",
        "ISSUER_CLIENT_ID": CLIENT_ID,
        "ISSUER_CLIENT_SECRET": secret,
        "ISSUER_REDIRECT_URI": f"http://127.0.0.1:{rp_port}/oidc/callback/",
    }
    subprocess.run([sys.executable, "-m", "tests.oidc_issuer.setup_issuer"], cwd=ROOT, env=env, check=True)
    args = [sys.executable, "-m", "tests.oidc_issuer.manage", "runserver", f"127.0.0.1:{port}", "--noreload"]
    ready = f"{url}/o/.well-known/openid-configuration"
    with _process(args, env, ready, data / "issuer.log", "the test issuer"):
        yield Issuer(f"{url}/o", secret, rp_port, data)


SERVER_NAME = "claimscope-oidc-test"  # the spawned server's application_name in pg_stat_activity


@contextmanager
def claimscope(issuer: Issuer, **overrides: str) -> Iterator[tuple[str, Path]]:
    """claimscope (uvicorn, the ASGI app) on the test database, with SSO configured from the environment;
    yields its URL and its log file."""
    db = connection.settings_dict
    if connection.vendor == "postgresql":
        # Named, so that only its connections are ended afterwards.
        database = {
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
            f"?application_name={SERVER_NAME}"
        }
    else:  # the embedded default: the test database is a file the server opens too
        database = {"SQLITE_PATH": str(db["NAME"])}
    env = (
        _base_env()
        | database
        | {
            "CLAIMSCOPE_OIDC_ISSUER": issuer.url,
            "CLAIMSCOPE_OIDC_AUTHORIZATION_ENDPOINT": issuer.endpoint("authorize/"),
            "CLAIMSCOPE_OIDC_TOKEN_ENDPOINT": issuer.endpoint("token/"),
            "CLAIMSCOPE_OIDC_USERINFO_ENDPOINT": issuer.endpoint("userinfo/"),
            "CLAIMSCOPE_OIDC_JWKS_ENDPOINT": issuer.endpoint(".well-known/jwks.json"),
            "CLAIMSCOPE_OIDC_CLIENT_ID": CLIENT_ID,
            "CLAIMSCOPE_OIDC_CLIENT_SECRET": issuer.client_secret,
            **overrides,
        }
    )
    base = f"http://127.0.0.1:{issuer.rp_port}"
    args = [sys.executable, "-m", "uvicorn", "dashboard.asgi:application", "--port", str(issuer.rp_port)]
    args += ["--host", "127.0.0.1", "--log-level", "warning", "--lifespan", "off"]
    log = issuer.data / f"claimscope-{secrets.token_hex(4)}.log"
    with _process(args, env, f"{base}/healthz", log, "claimscope"):
        yield base, log
    # Its connections to the test database must end before pytest-django drops it. Only its own: this
    # process's persistent connections (the live feed's threads) must not die under the next tests.
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            [SERVER_NAME],
        )


class _Form(HTMLParser):
    """The first form of a page: its action and its fields."""

    def __init__(self) -> None:
        super().__init__()
        self.action: str | None = None
        self.fields: dict[str, str] = {}
        self.links: list[tuple[str, str]] = []
        self._href: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and self.action is None:
            self.action = a.get("action", "")
        if tag == "input" and a.get("name"):
            self.fields.setdefault(a["name"], a.get("value", ""))
        if tag == "a":
            self._href = a.get("href")

    def handle_data(self, data: str) -> None:
        if self._href is not None and data.strip():
            self.links.append((data.strip(), self._href))
            self._href = None


def parse(html: str) -> _Form:
    form = _Form()
    form.feed(html)
    return form


def sso_login(base: str) -> tuple[requests.Session, requests.Response]:
    """Click "Log in with SSO" on claimscope's login page, sign in at the issuer, follow the redirects."""
    browser = requests.Session()
    login_page = browser.get(f"{base}/accounts/login/", timeout=10)
    login_page.raise_for_status()
    href = dict(parse(login_page.text).links)["Log in with SSO"]
    at_issuer = browser.get(base + href, timeout=30)  # -> issuer authorize -> issuer login page
    at_issuer.raise_for_status()
    assert not at_issuer.url.startswith(base) and "/accounts/login/" in at_issuer.url
    form = parse(at_issuer.text)
    data = form.fields | {"username": ISSUER_USER, "password": ISSUER_PASSWORD}
    # -> issuer authorize -> claimscope callback (token, ID token check, userinfo) -> claimscope
    done = browser.post(at_issuer.url, data=data, headers={"Referer": at_issuer.url}, timeout=30)
    return browser, done


def test_sso_logs_in_a_new_user_with_no_namespaces(issuer: Issuer) -> None:
    with claimscope(issuer) as (base, _):
        browser, done = sso_login(base)
        assert done.status_code == 200 and done.url == f"{base}/", done.url
        user = get_user_model().objects.get(email="sam@example.org")
        assert user.username.startswith("oidc-") and not user.has_usable_password()
        assert user.get_username() in done.text  # the nav shows who is logged in
        # Secure by default: a new SSO user is granted no namespace.
        assert not NamespaceGrant.objects.filter(user=user).exists()
        claims = browser.get(f"{base}/api/v1/claims/", timeout=10).json()
        assert claims["results"] == []
        # Logged in on claimscope: an API call with this session works, without one it does not.
        assert browser.get(f"{base}/api/v1/summary/", timeout=10).status_code == 200
        assert requests.get(f"{base}/api/v1/summary/", timeout=10).status_code in (401, 403)


def test_a_namespaces_claim_becomes_the_users_grants(issuer: Issuer, fleet) -> None:
    with claimscope(issuer, CLAIMSCOPE_OIDC_NAMESPACES_CLAIM="namespaces") as (base, _):
        browser, done = sso_login(base)
        assert done.url == f"{base}/"
        user = get_user_model().objects.get(email="sam@example.org")
        grants = set(NamespaceGrant.objects.filter(user=user).values_list("cluster", "namespace"))
        assert grants == {(None, "research")}
        rows = browser.get(f"{base}/api/v1/claims/?page_size=1000", timeout=10).json()["results"]
        assert rows and {r["namespace"] for r in rows} == {"research"}


class _JWKS(BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def impostor_jwks(issuer: Issuer) -> Iterator[str]:
    """A JWKS with the issuer's key id but another RSA key: the ID token's signature cannot verify."""
    real = requests.get(issuer.endpoint(".well-known/jwks.json"), timeout=10).json()["keys"][0]
    fake = json.loads(jwk.JWK.generate(kty="RSA", size=2048).export_public())
    fake |= {"kid": real["kid"], "alg": real.get("alg", "RS256"), "use": "sig"}
    handler = type("Impostor", (_JWKS,), {"body": json.dumps({"keys": [fake]}).encode()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    finally:
        server.shutdown()
        server.server_close()


def test_an_id_token_signed_by_another_key_is_refused(issuer: Issuer) -> None:
    with impostor_jwks(issuer) as jwks, claimscope(issuer, CLAIMSCOPE_OIDC_JWKS_ENDPOINT=jwks) as (base, log):
        browser, done = sso_login(base)
        assert done.url == f"{base}/accounts/login/?sso=failed"
        assert "SSO login failed: JWS token verification failed" in log.read_text()
        assert "Single sign-on failed" in done.text
        assert not get_user_model().objects.filter(email="sam@example.org").exists()
        assert browser.get(f"{base}/api/v1/summary/", timeout=10).status_code in (401, 403)


def test_an_id_token_for_another_issuer_is_refused(issuer: Issuer) -> None:
    with claimscope(issuer, CLAIMSCOPE_OIDC_ISSUER="http://127.0.0.1:1/elsewhere") as (base, log):
        _, done = sso_login(base)
        assert done.url == f"{base}/accounts/login/?sso=failed"
        assert "is not the configured one" in log.read_text()
        assert not get_user_model().objects.filter(email="sam@example.org").exists()


def test_without_oidc_variables_there_is_no_sso_button_and_no_route(client) -> None:
    assert not settings.CLAIMSCOPE_OIDC_ENABLED
    page = client.get("/accounts/login/").content.decode()
    assert "Log in with SSO" not in page
    assert client.get("/oidc/authenticate/").status_code in (302, 404)
