"""A relist goes from the source's pages through normalize into the database page by page: it never holds
the whole list, and stores exactly what a list held at once would."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from fleet import ingest
from fleet.ingest import apply
from fleet.kube import verify
from fleet.kube.reflector import Reflector
from fleet.models import Device, GpuState, ResourceSlice
from simulator import nvidia

SLICES = 1_200  # more than two of the relist's pages (RELIST_PAGE, set below)
RELIST_PAGE = 500
PAGE = 100  # the source's page size, as an API server's ``limit``


class Tracked(dict):
    """A dict that can be weakly referenced: each slice's ``spec``, which normalize keeps by reference
    in the record's stored raw copy, so it lives exactly as long as the object or its record does."""


class PagedSource:
    """Serves a kind in pages like an API server's ``limit``/``continue``, and counts the slices in flight
    (served and not yet freed) each time it serves a page."""

    def __init__(self, objects: list[dict[str, Any]], resource_version: str) -> None:
        self.objects = objects
        self.resource_version = resource_version
        self.alive = 0
        self.peak = 0
        self.pages_served = 0

    def list_pages(self, kind: str) -> tuple[str, Iterator[list[dict[str, Any]]]]:
        def pages() -> Iterator[list[dict[str, Any]]]:
            for start in range(0, len(self.objects), PAGE):
                page = [self._decoded(o) for o in self.objects[start : start + PAGE]]
                for obj in page:
                    self.alive += 1
                    weakref.finalize(obj["spec"], self._freed)
                self.peak = max(self.peak, self.alive)
                self.pages_served += 1
                yield page
                del page

        return self.resource_version, pages()

    def _freed(self) -> None:
        self.alive -= 1

    @staticmethod
    def _decoded(obj: dict[str, Any]) -> dict[str, Any]:
        """A fresh copy, as the JSON decoder hands out (the source keeps only its templates)."""
        return {**obj, "metadata": dict(obj["metadata"]), "spec": Tracked(obj["spec"])}

    def list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        raise AssertionError("a paged source is listed by pages")

    def watch(self, kind: str, resource_version: str, timeout_seconds: float | None = None) -> Any:
        return iter(())


def slice_name(node: str) -> str:
    (obj,) = nvidia.node_slices(node, "H100", mode="full", gpus=1)
    return str(obj["metadata"]["name"])


def slices(count: int, version: int) -> list[dict[str, Any]]:
    out = []
    for i in range(count):
        (obj,) = nvidia.node_slices(f"node-{i:05d}", "H100", mode="full", gpus=1)
        obj["metadata"]["resourceVersion"] = str(version + i)
        out.append(obj)
    return out


@pytest.mark.django_db(transaction=True)
def test_a_relist_larger_than_a_page_never_holds_the_whole_list(monkeypatch):
    monkeypatch.setattr(apply, "RELIST_PAGE", RELIST_PAGE)  # the production page is tuned for COPY
    cluster = ingest.get_or_create_cluster("paged")
    objects = slices(SLICES, 1_000)
    source = PagedSource(objects, "100000")
    Reflector(cluster, "ResourceSlice", source).relist()
    assert source.pages_served == SLICES // PAGE
    # At most the relist's page being written plus the source page being normalized.
    assert source.peak <= RELIST_PAGE + PAGE < SLICES
    assert ResourceSlice.objects.filter(cluster=cluster).count() == SLICES
    assert Device.objects.filter(cluster=cluster).count() == SLICES
    assert GpuState.objects.filter(cluster=cluster).count() == SLICES

    # A relist over the stored rows (after a 410): 100 slices gone, 100 changed, the rest as stored.
    changed = slices(SLICES, 1_000)[100:]
    for obj in changed[:100]:
        obj["metadata"]["resourceVersion"] = str(200_000 + int(obj["metadata"]["resourceVersion"]))
        obj["spec"]["devices"][0]["taints"] = [{"key": "xid", "value": "79", "effect": "NoSchedule"}]
    again = PagedSource(changed, "300000")
    Reflector(cluster, "ResourceSlice", again).relist()
    assert again.peak <= RELIST_PAGE + PAGE < len(changed)
    assert ResourceSlice.objects.filter(cluster=cluster).count() == SLICES - 100
    assert Device.objects.filter(cluster=cluster, tainted=True).count() == 100
    assert GpuState.objects.filter(cluster=cluster).count() == SLICES - 100
    assert GpuState.objects.filter(cluster=cluster, tainted=True).count() == 100


def test_pages_are_consumed_only_as_they_are_asked_for():
    produced: list[int] = []

    def records() -> Iterator[int]:
        for i in itertools.count():
            produced.append(i)
            yield i

    pages = apply.pages(records(), 3)  # type: ignore[arg-type]
    assert next(pages) == [0, 1, 2] and produced == [0, 1, 2]
    assert list(apply.pages(iter(range(7)), 3)) == [[0, 1, 2], [3, 4, 5], [6]]  # type: ignore[arg-type]


@pytest.mark.django_db(transaction=True)
def test_verify_compares_a_kind_page_by_page_and_still_finds_every_difference(monkeypatch):
    monkeypatch.setattr(apply, "RELIST_PAGE", RELIST_PAGE)
    cluster = ingest.get_or_create_cluster("paged-verify")
    Reflector(cluster, "ResourceSlice", PagedSource(slices(SLICES, 1_000), "100000")).relist()

    # The live list: the first slice gone, one on the last page newer, one replaced, one new.
    live = slices(SLICES, 1_000)[1:]
    live[-1]["metadata"]["resourceVersion"] = "900000"
    live[-2]["metadata"]["uid"] = "another-uid"
    live.extend(s for s in slices(SLICES + 1, 1_000)[SLICES:])
    source = PagedSource(live, "900001")
    found = {(d.key, d.problem) for d in verify.compare_kind(cluster, source, "ResourceSlice")}

    # At most the page just compared (still bound while the next is decoded) and the next one.
    assert source.pages_served == -(-len(live) // PAGE) and source.peak <= 2 * PAGE < len(live)
    name = {i: f"node-{i:05d}" for i in (0, SLICES - 2, SLICES - 1, SLICES)}
    assert found == {
        (slice_name(name[0]), "ghost"),
        (slice_name(name[SLICES - 1]), "stale"),
        (slice_name(name[SLICES - 2]), "replaced"),
        (slice_name(name[SLICES]), "missing"),
    }
