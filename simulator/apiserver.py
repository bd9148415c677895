"""The simulator behind the Kubernetes list/watch HTTP protocol.

Workers in other processes (``make demo-stack``, benchmarks) reach a simulated cluster exactly as they
reach a real one: through a kubeconfig, paged lists (``limit``/``continue``) and chunked watch streams
(``watch=true``, ``resourceVersion``, ``allowWatchBookmarks``: a BOOKMARK every ``bookmark_seconds``,
``timeoutSeconds``), with bearer-token authentication and Status objects for errors (401, 404, 410 Expired
inside the stream). Only the read paths claimscope uses are served; anything else is a 404 Status.

The standard library's threading HTTP server is enough here: one thread per open watch, on loopback.
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import orjson

from simulator.cluster import SimulatedCluster

log = logging.getLogger(__name__)
Obj = dict[str, Any]

#: URL path -> (kind, apiVersion of the List)
PATHS: dict[str, tuple[str, str]] = {
    "/api/v1/nodes": ("Node", "v1"),
    "/api/v1/pods": ("Pod", "v1"),
    "/api/v1/events": ("Event", "v1"),
    "/apis/resource.k8s.io/v1/resourceslices": ("ResourceSlice", "resource.k8s.io/v1"),
    "/apis/resource.k8s.io/v1/deviceclasses": ("DeviceClass", "resource.k8s.io/v1"),
    "/apis/resource.k8s.io/v1/devicetaintrules": ("DeviceTaintRule", "resource.k8s.io/v1"),
    "/apis/resource.k8s.io/v1/resourceclaims": ("ResourceClaim", "resource.k8s.io/v1"),
    "/apis/resource.k8s.io/v1/resourceclaimtemplates": ("ResourceClaimTemplate", "resource.k8s.io/v1"),
}
MAX_WATCH_SECONDS = 600.0
#: Seconds between BOOKMARK events on a watch that asked for them (``allowWatchBookmarks``). The real API
#: server sends one about every minute; ours comes well within the watchers' 70 s silence limit
#: (``StreamConfig.idle_timeout``) even on a loaded machine, so a quiet kind keeps its connection.
BOOKMARK_SECONDS = 15.0


def status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Pages:
    """Snapshots of lists being paged, so every page of one list is from the same resourceVersion."""

    def __init__(self, keep: int = 32) -> None:
        self._lock = threading.Lock()
        self._lists: dict[str, list[Obj]] = {}
        self._keep = keep

    def start(self, items: list[Obj]) -> str:
        key = base64.urlsafe_b64encode(
            threading.current_thread().name.encode() + str(id(items)).encode()
        ).decode()
        with self._lock:
            if len(self._lists) >= self._keep:
                self._lists.pop(next(iter(self._lists)))
            self._lists[key] = items
        return key

    def get(self, key: str) -> list[Obj] | None:
        with self._lock:
            return self._lists.get(key)


class SimulatorAPIServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        cluster: SimulatedCluster,
        token: str,
        host: str = "127.0.0.1",
        port: int = 0,
        bookmark_seconds: float = BOOKMARK_SECONDS,
    ) -> None:
        if not bookmark_seconds > 0:  # also refuses NaN
            raise ValueError(f"bookmark_seconds must be > 0, got {bookmark_seconds!r}")
        super().__init__((host, port), _Handler)
        self.cluster = cluster
        self.token = token
        self.bookmark_seconds = bookmark_seconds
        self.pages = _Pages()
        self.stopping = threading.Event()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def write_kubeconfig(self, path: Path, context: str = "simulator") -> Path:
        """A kubeconfig pointing at this server with its bearer token (file mode 0600)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {"token": self.token}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
            "current-context": context,
        }
        # Created 0600 from the start: it holds the bearer token.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(config, indent=2))
        return path

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="simulator-apiserver", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self.stopping.set()
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SimulatorAPIServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # ------------------------------------------------------------------------------------------ plumbing

    def _send_json(self, code: int, body: Obj) -> None:
        data = orjson.dumps(body)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization", "")
        expected = f"Bearer {self.server.token}"
        return hmac.compare_digest(header.encode(), expected.encode())

    # ------------------------------------------------------------------------------------------ GET

    def do_GET(self) -> None:
        if not self._authorized():
            self._send_json(401, status(401, "Unauthorized", "Unauthorized"))
            return
        url = urlparse(self.path)
        if url.path in ("/healthz", "/readyz", "/livez"):
            data = b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        target = PATHS.get(url.path.rstrip("/"))
        if target is None:
            self._send_json(
                404, status(404, "NotFound", f"the server could not find the requested resource ({url.path})")
            )
            return
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        kind, api_version = target
        if query.get("watch") in ("1", "true", "True"):
            self._watch(kind, query)
        else:
            self._list(kind, api_version, query)

    def _list(self, kind: str, api_version: str, query: dict[str, str]) -> None:
        try:
            limit = int(query.get("limit") or 0)
            if limit < 0:
                raise ValueError
        except ValueError:
            self._send_json(400, status(400, "BadRequest", f"invalid limit {query.get('limit')!r}"))
            return
        token = query.get("continue", "")
        if token:
            decoded = self._decode_continue(token)
            if decoded is None:
                self._send_json(410, status(410, "Expired", "the provided continue parameter is too old"))
                return
            key, offset, rv, token_kind = decoded
            items = self.server.pages.get(key) if token_kind == kind else None
            if items is None:
                self._send_json(410, status(410, "Expired", "the provided continue parameter is too old"))
                return
        else:
            items, rv = self.server.cluster.list(kind)
            key, offset = "", 0
        meta: Obj = {"resourceVersion": rv}
        page = items[offset:]
        if limit and len(page) > limit:
            page = page[:limit]
            if not key:
                key = self.server.pages.start(items)
            meta["continue"] = self._encode_continue(key, offset + limit, rv, kind)
            meta["remainingItemCount"] = len(items) - offset - limit
        self._send_json(
            200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": page}
        )

    @staticmethod
    def _encode_continue(key: str, offset: int, rv: str, kind: str) -> str:
        return base64.urlsafe_b64encode(orjson.dumps([key, offset, rv, kind])).decode()

    @staticmethod
    def _decode_continue(token: str) -> tuple[str, int, str, str] | None:
        try:
            key, offset, rv, kind = orjson.loads(base64.urlsafe_b64decode(token.encode()))
            return str(key), max(0, int(offset)), str(rv), str(kind)
        except (ValueError, TypeError, orjson.JSONDecodeError):
            return None

    def _watch(self, kind: str, query: dict[str, str]) -> None:
        try:
            timeout = min(float(query.get("timeoutSeconds") or MAX_WATCH_SECONDS), MAX_WATCH_SECONDS)
            if not timeout > 0:  # also refuses NaN
                raise ValueError
        except ValueError:
            self._send_json(
                400, status(400, "BadRequest", f"invalid timeoutSeconds {query.get('timeoutSeconds')!r}")
            )
            return
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true", "True")
        events = self.server.cluster.watch(
            kind,
            query.get("resourceVersion", ""),
            timeout_seconds=timeout,
            # Periodic bookmarks only for a client that takes them (the others would have them dropped).
            bookmark_interval=self.server.bookmark_seconds if bookmarks else None,
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for event in self._filtered(events, bookmarks):
                line = orjson.dumps(event) + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away: nothing to clean up but the generator
        finally:
            close = getattr(events, "close", None)
            if close:
                close()
        self.close_connection = True

    def _filtered(self, events: Iterator[Obj], bookmarks: bool) -> Iterator[Obj]:
        for event in events:
            if self.server.stopping.is_set():
                return
            if event.get("type") == "BOOKMARK" and not bookmarks:
                continue
            yield event
