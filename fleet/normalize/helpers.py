"""What every kind's normalize function shares: :class:`NormalizeError`, typed field access that names
the failing field, metadata and resourceVersions, selectors, quantities and counts.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from fleet.normalize.records import Meta
from fleet.quantity import QuantityError, parse_quantity

MAX_RESOURCE_VERSION = 2**128 - 1


class NormalizeError(ValueError):
    """An object we cannot read. ``obj`` names it (kind namespace/name) and ``field`` the culprit."""

    def __init__(self, obj: str, field_path: str, problem: str) -> None:
        super().__init__(f"{obj}: field {field_path}: {problem}")
        self.obj = obj
        self.field = field_path
        self.problem = problem


class _Reader:
    """Typed access to nested fields that raises NormalizeError with the field's path."""

    def __init__(self, obj_name: str) -> None:
        self.obj = obj_name

    def fail(self, path: str, problem: str) -> NormalizeError:
        return NormalizeError(self.obj, path, problem)

    def mapping(self, value: Any, path: str, required: bool = False) -> dict[str, Any]:
        if value is None:
            if required:
                raise self.fail(path, "missing")
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"expected an object, got {type(value).__name__}")
        return value

    def seq(self, value: Any, path: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list, got {type(value).__name__}")
        return value

    def string(self, value: Any, path: str, required: bool = False, max_len: int = 1024) -> str:
        if value is None or value == "":
            if required:
                raise self.fail(path, "missing")
            return ""
        if not isinstance(value, str):
            raise self.fail(path, f"expected a string, got {type(value).__name__}")
        if len(value) > max_len:
            raise self.fail(path, f"longer than {max_len} characters")
        return value

    def integer(self, value: Any, path: str, default: int = 0, minimum: int | None = None) -> int:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(path, f"expected an integer, got {type(value).__name__}")
        if minimum is not None and value < minimum:
            raise self.fail(path, f"must be >= {minimum}")
        return value

    def boolean(self, value: Any, path: str) -> bool:
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.fail(path, f"expected a boolean, got {type(value).__name__}")
        return value

    def time(self, value: Any, path: str) -> datetime | None:
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise self.fail(path, f"expected an RFC 3339 time, got {type(value).__name__}")
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise self.fail(path, f"not an RFC 3339 time: {value[:40]!r}") from None
        if parsed.tzinfo is None:
            raise self.fail(path, "time without a time zone")
        return parsed

    def string_map(self, value: Any, path: str) -> dict[str, str]:
        data = self.mapping(value, path)
        for key, item in data.items():
            if not isinstance(item, str):
                raise self.fail(f"{path}.{key}", "expected a string")
        return data


def _describe(obj: Any, kind: str) -> str:
    """A name for error messages, even for objects too broken to read."""
    if not isinstance(obj, dict):
        return f"{kind} <not an object>"
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return f"{kind} <no metadata>"
    ns, name = meta.get("namespace"), meta.get("name")
    name = name if isinstance(name, str) else "<unnamed>"
    return f"{kind} {ns}/{name}" if isinstance(ns, str) and ns else f"{kind} {name}"


def parse_resource_version(value: Any, obj: str = "object") -> int:
    """resourceVersions are opaque strings to clients, but integers in practice (and comparable from 1.35)."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isdigit() and len(value) <= 39:
        number = int(value)
    else:
        raise NormalizeError(
            obj, "metadata.resourceVersion", f"expected a decimal integer, got {value!r:.60}"
        )
    if number > MAX_RESOURCE_VERSION:
        raise NormalizeError(obj, "metadata.resourceVersion", "larger than 128 bits")
    return number


_STRIP_METADATA = ("managedFields",)
# What the API server accepts for the names of every kind we watch (apimachinery's IsDNS1123Subdomain and
# IsDNS1123Label): an object named otherwise never came from a real cluster (a hand-edited snapshot, a
# broken source), and such a name would break the links of every page that lists it.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_NAMESPACE_NAME = re.compile(_DNS_LABEL)


def _meta(obj: Any, kind: str, namespaced: bool) -> tuple[Meta, _Reader]:
    name = _describe(obj, kind)
    r = _Reader(name)
    if not isinstance(obj, dict):
        raise r.fail("", "expected an object")
    md = r.mapping(obj.get("metadata"), "metadata", required=True)
    uid = r.string(md.get("uid"), "metadata.uid", required=True, max_len=128)
    obj_name = r.string(md.get("name"), "metadata.name", required=True, max_len=253)
    if not _SUBDOMAIN_NAME.fullmatch(obj_name):
        raise r.fail("metadata.name", f"{obj_name[:80]!r} is not a valid name (lowercase DNS subdomain)")
    namespace = r.string(md.get("namespace"), "metadata.namespace", required=namespaced, max_len=63)
    if namespaced and not _NAMESPACE_NAME.fullmatch(namespace):
        raise r.fail("metadata.namespace", f"{namespace[:80]!r} is not a valid namespace (DNS label)")
    # managedFields are large and say nothing we show; drop them from the stored copy.
    raw = dict(obj)
    raw["metadata"] = {k: v for k, v in md.items() if k not in _STRIP_METADATA}
    raw.setdefault("kind", kind)
    meta = Meta(
        kind=kind,
        uid=uid,
        namespace=namespace if namespaced else "",
        name=obj_name,
        resource_version=parse_resource_version(md.get("resourceVersion"), name),
        created_at=r.time(md.get("creationTimestamp"), "metadata.creationTimestamp"),
        deleted_at=r.time(md.get("deletionTimestamp"), "metadata.deletionTimestamp"),
        labels=r.string_map(md.get("labels"), "metadata.labels"),
        raw=raw,
    )
    return meta, r


def _selectors(r: _Reader, value: Any, path: str) -> list[str]:
    out = []
    for i, sel in enumerate(r.seq(value, path)):
        sel = r.mapping(sel, f"{path}[{i}]")
        cel = r.mapping(sel.get("cel"), f"{path}[{i}].cel")
        out.append(r.string(cel.get("expression"), f"{path}[{i}].cel.expression", max_len=10240))
    return out


def _quantities(r: _Reader, value: Any, path: str) -> dict[str, str]:
    """A map of Kubernetes quantities, as strings. YAML written by hand may give a plain number
    (``memory: 40``), which the API server accepts too."""
    out = {}
    for key, item in r.mapping(value, path).items():
        if isinstance(item, int) and not isinstance(item, bool) and -INT64_MAX - 1 <= item <= INT64_MAX:
            item = str(item)
        if not isinstance(item, str):
            raise r.fail(f"{path}.{key}", "expected a quantity such as 40Gi")
        try:
            parse_quantity(item)
        except QuantityError:
            raise r.fail(f"{path}.{key}", f"not a quantity: {item[:40]!r}") from None
        out[str(key)] = item
    return out


INT64_MAX = 2**63 - 1


def _count(r: _Reader, value: Any, path: str) -> int:
    count = r.integer(value, path, default=1, minimum=0)
    if count > INT64_MAX:  # an int64 for the API server
        raise r.fail(path, f"must be <= {INT64_MAX}")
    return count
