"""A tiny JSON client for the test control plane.

Raw JSON instead of the generated ``kubernetes`` models: the tests need the exact wire shape of
``resource.k8s.io/v1`` (including fields newer than the Python client's models), and they need the
apiserver's error messages verbatim.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode

import urllib3

Obj = dict[str, Any]
T = TypeVar("T")

# Plural resource paths for the kinds the tests touch: (api prefix, plural, namespaced).
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "Event": ("/api/v1", "events", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
    "ResourceClaim": ("/apis/resource.k8s.io/v1", "resourceclaims", True),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "DeviceTaintRule": ("/apis/resource.k8s.io/v1", "devicetaintrules", False),
}


class ApiError(Exception):
    """A non-2xx answer; ``status`` is the decoded ``Status`` object when the server sent one."""

    def __init__(self, code: int, status: Obj, method: str, path: str) -> None:
        self.code = code
        self.status = status
        self.message: str = status.get("message", "")
        super().__init__(f"{method} {path}: HTTP {code}: {self.message or status}")


class Kube:
    """Bearer-token JSON client for one apiserver."""

    def __init__(self, url: str, token: str, ca_file: str) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._http = urllib3.PoolManager(
            ca_certs=ca_file, cert_reqs="CERT_REQUIRED", timeout=urllib3.Timeout(connect=5, read=60)
        )

    def request(
        self,
        method: str,
        path: str,
        body: Obj | list[Any] | None = None,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
    ) -> Obj:
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        url = self.url + path + ("?" + urlencode(query) if query else "")
        resp = self._http.request(method, url, body=data, headers=headers)
        text = resp.data.decode() if resp.data else ""
        try:
            decoded: Obj = json.loads(text) if text else {}
        except json.JSONDecodeError:
            decoded = {"message": text}
        if resp.status >= 300:
            raise ApiError(resp.status, decoded, method, path)
        return decoded

    @staticmethod
    def path(kind: str, name: str = "", namespace: str = "", subresource: str = "") -> str:
        prefix, plural, namespaced = RESOURCES[kind]
        parts = [prefix]
        if namespaced and namespace:
            parts += ["namespaces", namespace]
        parts.append(plural)
        if name:
            parts.append(name)
        if subresource:
            parts.append(subresource)
        return "/".join(parts)

    def create(self, obj: Obj, namespace: str = "") -> Obj:
        ns = namespace or obj.get("metadata", {}).get("namespace", "")
        return self.request("POST", self.path(obj["kind"], namespace=ns), obj)

    def get(self, kind: str, name: str, namespace: str = "") -> Obj:
        return self.request("GET", self.path(kind, name, namespace))

    def list(self, kind: str, namespace: str = "", **query: str) -> list[Obj]:
        items: list[Obj] = self.request("GET", self.path(kind, namespace=namespace), query=query or None)[
            "items"
        ]
        return items

    def patch(self, kind: str, name: str, patch: Obj, namespace: str = "", subresource: str = "") -> Obj:
        return self.request(
            "PATCH",
            self.path(kind, name, namespace, subresource),
            patch,
            content_type="application/merge-patch+json",
        )

    def delete(self, kind: str, name: str, namespace: str = "") -> None:
        try:
            self.request("DELETE", self.path(kind, name, namespace))
        except ApiError as err:
            if err.code != 404:
                raise

    def delete_collection(self, kind: str, namespace: str = "") -> None:
        self.request("DELETE", self.path(kind, namespace=namespace))


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2) -> T:
    """Polls ``check`` until it returns something other than None/False; fails after ``timeout``.

    The last exception raised by ``check`` (if any) is part of the timeout message, so a wait that
    never succeeds explains itself.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
            if result is not None and result is not False:
                return result
        except Exception as err:  # reported in the timeout message below
            last_error = err
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")
        time.sleep(interval)
