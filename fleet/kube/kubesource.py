"""A real API server as a :class:`~fleet.kube.source.Source`: raw HTTP (urllib3) and orjson.

The generated ``kubernetes`` models are not used to decode responses: building them is many times slower
than ``orjson.loads`` (see bench/README.md) and they drop fields newer than the client. The ``kubernetes``
package is used only to read kubeconfig files and the in-cluster service account, so every auth method it
supports (tokens, client certificates, exec plugins) works here too.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import urllib3
from kubernetes import client as kclient
from kubernetes import config as kconfig
from kubernetes.config.incluster_config import InClusterConfigLoader

from fleet.kube.source import Forbidden, Gone, Obj, SourceError, status_error

T = TypeVar("T")

PAGE_SIZE = 500
Items = list[Obj]  # a page of a list (``list`` is a method name inside KubeSource)
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the API: path prefix, plural, whether it is namespaced, and its apiVersion."""

    prefix: str
    plural: str
    api_version: str


RESOURCES: dict[str, Resource] = {
    "ResourceSlice": Resource("/apis/resource.k8s.io/v1", "resourceslices", "resource.k8s.io/v1"),
    "ResourceClaim": Resource("/apis/resource.k8s.io/v1", "resourceclaims", "resource.k8s.io/v1"),
    "ResourceClaimTemplate": Resource(
        "/apis/resource.k8s.io/v1", "resourceclaimtemplates", "resource.k8s.io/v1"
    ),
    "DeviceClass": Resource("/apis/resource.k8s.io/v1", "deviceclasses", "resource.k8s.io/v1"),
    "DeviceTaintRule": Resource("/apis/resource.k8s.io/v1", "devicetaintrules", "resource.k8s.io/v1"),
    "Node": Resource("/api/v1", "nodes", "v1"),
    "Pod": Resource("/api/v1", "pods", "v1"),
    "Event": Resource("/api/v1", "events", "v1"),
}


class KubeConfigError(ValueError):
    """A kubeconfig (or the in-cluster environment) we cannot use; the message says what is wrong."""


class KubeSource:
    """list/watch of the kinds in :data:`RESOURCES` against one API server.

    ``configuration`` is a ``kubernetes.client.Configuration`` as filled by the config loaders; its API key
    is read before every request so that rotated service-account tokens and exec plugins keep working.
    """

    def __init__(self, configuration: kclient.Configuration, read_timeout: float = 80.0) -> None:
        self.configuration = configuration
        self.server = str(configuration.host).rstrip("/")
        self.read_timeout = read_timeout
        tls: dict[str, Any] = {}
        if self.server.startswith("https"):
            if configuration.verify_ssl:
                tls["cert_reqs"] = "CERT_REQUIRED"
                if configuration.ssl_ca_cert:
                    tls["ca_certs"] = configuration.ssl_ca_cert
            else:
                tls["cert_reqs"] = "CERT_NONE"
            if configuration.cert_file:
                tls["cert_file"] = configuration.cert_file
                tls["key_file"] = configuration.key_file
            if configuration.tls_server_name:
                tls["server_hostname"] = configuration.tls_server_name
        # No urllib3 retries: the reflector owns retry policy (backoff with jitter, relist on 410).
        self._http = urllib3.PoolManager(num_pools=4, maxsize=16, retries=False, **tls)

    # --------------------------------------------------------------------------------------- factories

    @classmethod
    def from_kubeconfig(cls, path: str, context: str | None = None) -> KubeSource:
        configuration = kclient.Configuration()
        try:
            kconfig.load_kube_config(
                config_file=path, context=context or None, client_configuration=configuration
            )
        except (kconfig.ConfigException, OSError, ValueError, TypeError) as exc:
            where = f"{path}" + (f" context {context!r}" if context else "")
            raise KubeConfigError(f"kubeconfig {where}: {exc}") from exc
        return cls(configuration)

    @classmethod
    def in_cluster(
        cls,
        token_file: str = SERVICE_ACCOUNT + "/token",
        ca_file: str = SERVICE_ACCOUNT + "/ca.crt",
        environ: Mapping[str, str] | None = None,
    ) -> KubeSource:
        """The pod's service account; the token file is read again every minute (it is rotated)."""
        configuration = kclient.Configuration()
        env = os.environ if environ is None else environ
        loader = InClusterConfigLoader(token_filename=token_file, cert_filename=ca_file, environ=env)
        try:
            loader.load_and_set(configuration)
        except kconfig.ConfigException as exc:
            raise KubeConfigError(f"in-cluster service account: {exc}") from exc
        return cls(configuration)

    # --------------------------------------------------------------------------------------- HTTP

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "claimscope-watcher"}
        # auth_settings() runs the loaders' refresh hook (exec plugins, rotated service-account tokens).
        settings: dict[str, Any] = dict(self.configuration.auth_settings())
        for auth in settings.values():
            if isinstance(auth, dict) and auth.get("in") == "header" and auth.get("value"):
                headers[str(auth["key"]).title()] = str(auth["value"])
        return headers

    def _get(self, path: str, query: dict[str, str], read_timeout: float, stream: bool) -> Any:
        url = self.server + path
        try:
            resp = self._http.request(
                "GET",
                url,
                fields=query,
                headers=self._headers(),
                preload_content=not stream,
                timeout=urllib3.Timeout(connect=10.0, read=read_timeout),
            )
        except urllib3.exceptions.HTTPError as exc:
            raise SourceError(f"GET {path}: {exc}") from exc
        if resp.status >= 300:
            body = resp.data if not stream else resp.read()
            resp.release_conn()
            raise _http_error(resp.status, body, path)
        return resp

    def post(self, path: str, body: Mapping[str, Any], timeout: float = 10.0) -> Obj:
        """POST a JSON object (a SubjectAccessReview, say); the decoded answer."""
        try:
            resp = self._http.request(
                "POST",
                self.server + path,
                body=orjson.dumps(body),
                headers={**self._headers(), "Content-Type": "application/json"},
                timeout=urllib3.Timeout(connect=10.0, read=timeout),
            )
        except urllib3.exceptions.HTTPError as exc:
            raise SourceError(f"POST {path}: {exc}") from exc
        if resp.status >= 300:
            raise _http_error(resp.status, resp.data, path)
        answer: Obj = orjson.loads(resp.data)
        return answer

    def _path(self, kind: str) -> str:
        try:
            res = RESOURCES[kind]
        except KeyError:
            raise SourceError(f"unsupported kind {kind!r}") from None
        return f"{res.prefix}/{res.plural}"

    # --------------------------------------------------------------------------------------- Source

    def list(self, kind: str) -> tuple[list[Obj], str]:
        """All objects of ``kind`` (read in pages of 500); the resourceVersion of the (consistent) list."""
        resource_version, pages = self.list_pages(kind)
        return [item for page in pages for item in page], resource_version

    def list_pages(self, kind: str) -> tuple[str, Iterator[Items]]:
        """The list of ``kind`` a page of 500 at a time: its resourceVersion (read with the first page,
        which is fetched now, so a refused list fails here) and the pages. The next page is fetched while
        the caller works on the current one, never further ahead: a relist thus holds at most two pages
        of decoded objects, and the server's time to encode a page overlaps ours to store the previous
        one (at XL, 116 pages of slices, the wait for the next page was 14% of the slice stream). A
        continue token that expires meanwhile (410) fails the relist, which the stream retries."""
        path = self._path(kind)
        first, token = self._page(kind, path, {"limit": str(PAGE_SIZE)})
        resource_version = str((first.get("metadata") or {}).get("resourceVersion") or "")

        def pages() -> Iterator[Items]:
            page, next_token = first, token
            while True:
                # Every page of a paged list carries the first page's snapshot version.
                upcoming = (
                    _in_background(self._page, kind, path, {"limit": str(PAGE_SIZE), "continue": next_token})
                    if next_token
                    else None
                )
                yield self._items(kind, page)
                if upcoming is None:
                    return
                page, next_token = upcoming.result()

        return resource_version, pages()

    def _page(self, kind: str, path: str, query: dict[str, str]) -> tuple[Obj, str]:
        resp = self._get(path, query, read_timeout=120.0, stream=False)
        try:
            page: Obj = orjson.loads(resp.data)
        except orjson.JSONDecodeError as exc:
            raise SourceError(f"GET {path}: not JSON: {exc}") from exc
        return page, str((page.get("metadata") or {}).get("continue") or "")

    @staticmethod
    def _items(kind: str, page: Obj) -> Items:
        res = RESOURCES[kind]
        items: Items = []
        for item in page.get("items") or []:
            # List items have neither kind nor apiVersion; the stored raw copy should.
            if isinstance(item, dict):
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", res.api_version)
            items.append(item)
        return items

    def watch(self, kind: str, resource_version: str, timeout_seconds: float | None = None) -> Iterator[Obj]:
        """Watch events after ``resource_version``, with bookmarks, until the server ends the watch."""
        path = self._path(kind)
        server_timeout = int(timeout_seconds) if timeout_seconds else random.randint(300, 600)
        query = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(max(1, server_timeout)),
        }
        resp = self._get(path, query, read_timeout=self.read_timeout, stream=True)
        return self._events(resp, path)

    def _events(self, resp: Any, path: str) -> Iterator[Obj]:
        buffer = b""
        try:
            for chunk in resp.stream(64 * 1024, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _decode_event(line, path)
            if buffer.strip():
                yield _decode_event(buffer, path)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise SourceError(f"watch {path}: {exc}") from exc
        finally:
            resp.release_conn()

    def close(self) -> None:
        self._http.clear()


def _decode_event(line: bytes, path: str) -> Obj:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise SourceError(f"watch {path}: undecodable event: {exc}") from exc
    if not isinstance(event, dict):
        raise SourceError(f"watch {path}: event is not an object")
    return event


def _http_error(status: int, body: bytes, path: str) -> SourceError:
    """Map an HTTP error answer (a metav1.Status, usually) to Gone / Forbidden / SourceError."""
    try:
        decoded = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        decoded = {"message": body[:500].decode(errors="replace")}
    if not isinstance(decoded, dict):
        decoded = {}
    decoded.setdefault("code", status)
    decoded.setdefault("message", f"HTTP {status} on GET {path}")
    error = status_error(decoded)
    if isinstance(error, Gone | Forbidden):
        return error
    return SourceError(f"GET {path}: HTTP {status}: {decoded.get('message')}")


def _in_background(fn: Callable[..., T], *args: Any) -> Future[T]:
    """``fn(*args)`` on a daemon thread of its own, as a Future: one request ahead of the caller, which
    blocks on the socket, where the GIL is released. Not a ThreadPoolExecutor: its threads are joined at
    interpreter exit, so a worker stopping while a page is in flight would wait for the read timeout
    (120 s); a caller that stops reading just leaves the thread to finish its one request."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to the caller, which raises it where it reads the page
            future.set_exception(exc)

    threading.Thread(target=run, name="list-page-ahead", daemon=True).start()
    return future
