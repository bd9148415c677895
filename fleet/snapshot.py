"""Read ``kubectl get ... -o yaml|json`` output: a List, a single object, or several YAML documents.

Pure: bytes in, object dicts out. Used by ``import_snapshot``, the offline diagnosis and tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import yaml

from fleet.normalize import KINDS


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML as Kubernetes means it: an unquoted 2026-01-01T00:00:00Z stays a string, not a datetime."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _Loader.yaml_implicit_resolvers.items()
}


class SnapshotError(ValueError):
    """A file we cannot read as Kubernetes objects; the message names the file and the problem."""


def _objects(doc: Any, where: str) -> Iterator[dict[str, Any]]:
    if doc is None:
        return
    if not isinstance(doc, dict):
        raise SnapshotError(f"{where}: expected a Kubernetes object or List, got {type(doc).__name__}")
    kind = doc.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
        # kubectl omits apiVersion/kind on List items of a single type (e.g. ResourceSliceList).
        item_kind = kind[: -len("List")] if kind != "List" else None
        for i, item in enumerate(doc["items"]):
            if not isinstance(item, dict):
                raise SnapshotError(f"{where}: items[{i}] is not an object")
            if item_kind and "kind" not in item:
                item = {**item, "kind": item_kind}
            yield item
    else:
        yield doc


def read_text(text: str | bytes, where: str = "<input>") -> list[dict[str, Any]]:
    """Objects in a JSON or (multi-document) YAML text."""
    data = text.encode() if isinstance(text, str) else text
    stripped = data.lstrip()
    if stripped[:1] in (b"{", b"["):
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise SnapshotError(f"{where}: invalid JSON: {exc}") from None
        docs = doc if isinstance(doc, list) else [doc]
    else:
        try:
            docs = list(yaml.load_all(data, Loader=_Loader))
        except yaml.YAMLError as exc:
            raise SnapshotError(f"{where}: invalid YAML: {exc}") from None
    return [obj for doc in docs for obj in _objects(doc, where)]


def read_files(paths: list[str | Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in paths:
        p = Path(path)
        try:
            data = p.read_bytes()
        except OSError as exc:
            raise SnapshotError(f"{p}: {exc.strerror}") from None
        out.extend(read_text(data, str(p)))
    return out


def by_kind(objects: list[dict[str, Any]]) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Group objects by the kinds we store; also return the kinds we skipped (with counts)."""
    grouped: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    skipped: dict[str, int] = {}
    for obj in objects:
        kind = obj.get("kind")
        if kind in grouped:
            grouped[kind].append(obj)
        else:
            skipped[str(kind)] = skipped.get(str(kind), 0) + 1
    return grouped, [f"{k} ({n})" for k, n in sorted(skipped.items())]
