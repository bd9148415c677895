"""The interface every cluster source offers: a real API server, a file snapshot or the simulator.

The reflector only knows this protocol, so the simulator exercises the production path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, cast

Obj = dict[str, Any]


class Source(Protocol):
    """``list`` returns the current objects of a kind and the list's resourceVersion; ``watch`` yields
    ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": {...}}`` after a resourceVersion, ending after
    about ``timeout_seconds`` (or at once, when the source has nothing to wait for)."""

    def list(self, kind: str) -> tuple[list[Obj], str]: ...

    def watch(
        self, kind: str, resource_version: str, timeout_seconds: float | None = None
    ) -> Iterator[Obj]: ...


def list_pages(source: Source, kind: str) -> tuple[str, Iterator[list[Obj]]]:
    """The list of ``kind`` as (its resourceVersion, its pages): the source's own pages when it has them,
    else its whole list as one page (snapshots and test sources hold their lists anyway)."""
    paged = getattr(source, "list_pages", None)
    if paged is not None:
        return cast(tuple[str, Iterator[list[Obj]]], paged(kind))
    items, resource_version = source.list(kind)
    return resource_version, iter([items])


class SourceError(Exception):
    """The source failed in a way worth retrying (connection refused, 5xx, a broken stream)."""


class Gone(SourceError):
    """410: the resourceVersion is too old for the server's history; the stream must relist."""


class Forbidden(SourceError):
    """401/403: our identity may not list or watch this kind. ``message`` is the server's."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


def status_error(status: dict[str, Any]) -> SourceError:
    """The exception for a watch ERROR event carrying a metav1.Status."""
    code = status.get("code")
    message = str(status.get("message") or status.get("reason") or "watch error")
    if code == 410 or status.get("reason") in ("Expired", "Gone"):
        return Gone(message)
    if code in (401, 403):
        return Forbidden(message, int(code))
    return SourceError(f"{code}: {message}")
