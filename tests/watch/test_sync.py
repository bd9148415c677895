"""List + watch of every kind against the real control plane: initial sync, changes, two clusters."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleet import clusters, ingest
from fleet.kube import streams
from fleet.kube.kubesource import KubeConfigError, KubeSource
from fleet.kube.reflector import Reflector
from fleet.kube.source import Forbidden
from fleet.models import Node
from tests.controlplane.kube import Kube, wait_for
from tests.controlplane.launcher import ControlPlane
from tests.watch.helpers import VISIBLE_WITHIN, cursor_state, make, stored, verify, wait_converged

NAMESPACED = {"ResourceClaim", "ResourceClaimTemplate", "Pod", "Event"}

pytestmark = pytest.mark.controlplane


def ns_of(kind: str, namespace: str) -> str:
    return namespace if kind in NAMESPACED else ""


def test_initial_sync_stores_one_object_of_every_kind(control_plane, kube, namespace, watch_clusters):
    for kind in streams.STREAM_KINDS:
        kube.create(make(kind, f"first-{kind.lower()}", ns_of(kind, namespace)))
    watch_clusters({"cp": str(control_plane.kubeconfig)})
    wait_converged("cp")
    for kind in streams.STREAM_KINDS:
        assert stored("cp", kind, f"first-{kind.lower()}", ns_of(kind, namespace)), kind
        assert cursor_state("cp", kind) == "watching"


@pytest.mark.parametrize("kind", streams.STREAM_KINDS)
def test_create_modify_delete_reach_the_database(kind, control_plane, kube: Kube, namespace, watch_clusters):
    watch_clusters({"cp": str(control_plane.kubeconfig)}, kinds=(kind,))
    wait_for("the initial list", lambda: cursor_state("cp", kind) == "watching", timeout=30)
    ns = ns_of(kind, namespace)
    name = f"w-{kind.lower()}"
    kube.create(make(kind, name, ns))
    wait_for(f"{kind} {name} stored", lambda: stored("cp", kind, name, ns), timeout=VISIBLE_WITHIN)

    kube.patch(kind, name, {"metadata": {"labels": {"changed": "yes"}}}, namespace=ns)
    wait_for(
        f"{kind} {name} label stored",
        lambda: (stored("cp", kind, name, ns) or {}).get("labels", {}).get("changed") == "yes",
        timeout=VISIBLE_WITHIN,
    )

    kube.request("DELETE", kube.path(kind, name, ns), query={"gracePeriodSeconds": "0"})
    wait_for(f"{kind} {name} deleted", lambda: stored("cp", kind, name, ns) is None, timeout=VISIBLE_WITHIN)


def test_pods_without_gpus_and_unrelated_events_are_not_stored(
    control_plane, kube, namespace, watch_clusters
):
    watch_clusters({"cp": str(control_plane.kubeconfig)}, kinds=("Pod", "Event"))
    plain = make("Pod", "web", namespace)
    plain["spec"].pop("resourceClaims")
    plain["spec"]["containers"][0]["resources"] = {}
    kube.create(plain)
    event = make("Event", "pulled", namespace)
    event["reason"] = "Pulled"
    kube.create(event)
    kube.create(make("Pod", "trainer", namespace))
    wait_for("the GPU pod stored", lambda: stored("cp", "Pod", "trainer", namespace), timeout=VISIBLE_WITHIN)
    wait_converged("cp", "Event")
    assert stored("cp", "Pod", "web", namespace) is None
    assert stored("cp", "Event", "pulled", namespace) is None


def test_two_clusters_are_mirrored_without_mixing(
    control_plane, second_control_plane: ControlPlane, kube, watch_clusters
):
    other = second_control_plane.client()
    kube.create(make("Node", "only-in-a"))
    other.create(make("Node", "only-in-b"))
    try:
        watch_clusters(
            {"a": str(control_plane.kubeconfig), "b": str(second_control_plane.kubeconfig)},
            kinds=("Node", "DeviceClass"),
        )
        wait_converged("a", "Node")
        wait_converged("b", "Node")
        assert stored("a", "Node", "only-in-a") and not stored("a", "Node", "only-in-b")
        assert stored("b", "Node", "only-in-b") and not stored("b", "Node", "only-in-a")
        other.create(make("Node", "later-in-b"))
        wait_for("later-in-b stored", lambda: stored("b", "Node", "later-in-b"), timeout=VISIBLE_WITHIN)
        assert not stored("a", "Node", "later-in-b")
    finally:
        for name in ("only-in-b", "later-in-b"):
            other.delete("Node", name)


def test_verify_reports_ghosts_missing_and_stale_objects(control_plane, kube, transactional_db, monkeypatch):
    monkeypatch.setenv(clusters.ENV, f"cp=kubeconfig:{control_plane.kubeconfig}")
    for name in ("real", "lost"):
        kube.create(make("Node", name))
    cluster = ingest.get_or_create_cluster("cp")
    Reflector(cluster, "Node", KubeSource.from_kubeconfig(str(control_plane.kubeconfig))).relist()
    assert verify("cp", "Node")[0] == 0
    # Corrupt the stored copy directly, as a buggy writer would.
    Node.objects.filter(cluster=cluster, name="real").update(resource_version=1)
    Node.objects.filter(cluster=cluster, name="lost").delete()
    ghost = Node.objects.get(cluster=cluster, name="real")
    ghost.pk = None
    ghost.name, ghost.uid = "ghost", "uid-of-a-ghost"
    ghost.save()
    status, output = verify("cp", "Node")
    assert status == 1
    assert "cp Node ghost: ghost" in output
    assert "cp Node lost: missing" in output
    assert "cp Node real: stale" in output


def test_the_in_cluster_service_account_is_used_and_a_bad_token_is_forbidden(control_plane, kube, tmp_path):
    host, port = control_plane.url.removeprefix("https://").split(":")
    environ = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
    kube.create(make("Node", "seen-in-cluster"))
    bad, good = tmp_path / "bad-token", tmp_path / "token"
    bad.write_text("not-a-valid-token")
    good.write_text(control_plane.admin_token)
    with pytest.raises(Forbidden) as refused:  # 401: the stream shows "forbidden" with this message
        KubeSource.in_cluster(str(bad), str(control_plane.ca_file), environ).list("Node")
    assert refused.value.status == 401
    source = KubeSource.in_cluster(str(good), str(control_plane.ca_file), environ)
    assert "seen-in-cluster" in [n["metadata"]["name"] for n in source.list("Node")[0]]
    with pytest.raises(KubeConfigError, match="Service host/port is not set"):
        KubeSource.in_cluster(str(good), str(control_plane.ca_file), {})


def test_a_list_longer_than_a_page_is_read_and_stored_page_by_page(
    control_plane, kube, transactional_db, monkeypatch
):
    from fleet.kube import kubesource
    from fleet.models import ResourceSlice

    monkeypatch.setenv(clusters.ENV, f"cp=kubeconfig:{control_plane.kubeconfig}")
    names = [f"paged-{i}" for i in range(5)]
    for name in names:
        kube.create(make("ResourceSlice", name))
    monkeypatch.setattr(kubesource, "PAGE_SIZE", 2)  # the API server's limit/continue over 5+ objects
    source = KubeSource.from_kubeconfig(str(control_plane.kubeconfig))
    version, pages = source.list_pages("ResourceSlice")
    sizes, listed = [], []
    for page in pages:
        sizes.append(len(page))
        listed += [o["metadata"]["name"] for o in page]
    assert len(sizes) >= 3 and max(sizes) == 2 and set(names) <= set(listed)
    assert len(listed) == len(set(listed))  # one consistent snapshot: nothing twice
    assert int(version) > 0
    cluster = ingest.get_or_create_cluster("cp")
    Reflector(cluster, "ResourceSlice", source).relist()  # the stream's relist pages the same way
    assert set(names) <= set(ResourceSlice.objects.filter(cluster=cluster).values_list("name", flat=True))
    assert verify("cp", "ResourceSlice")[0] == 0


def test_the_next_page_is_fetched_while_the_caller_stores_the_current_one_and_no_further(
    control_plane, kube, monkeypatch
):
    from fleet.kube import kubesource

    for i in range(7):
        kube.create(make("ResourceSlice", f"ahead-{i}"))
    monkeypatch.setattr(kubesource, "PAGE_SIZE", 2)
    source = KubeSource.from_kubeconfig(str(control_plane.kubeconfig))
    total_pages = -(-len(source.list("ResourceSlice")[0]) // 2)
    requested: list[str] = []
    fetch = source._page

    def counted(kind: str, path: str, query: dict[str, str]) -> tuple[dict[str, Any], str]:
        requested.append(query.get("continue", ""))
        return fetch(kind, path, query)

    monkeypatch.setattr(source, "_page", counted)
    _, pages = source.list_pages("ResourceSlice")
    seen = 0
    for _page in pages:
        seen += 1
        # While this page is being worked on, the next one is requested without the caller asking (poll:
        # the request starts on the fetching thread) ...
        wanted = min(seen + 1, total_pages)
        deadline = time.monotonic() + 10
        while len(requested) < wanted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(requested) == wanted
        # ... and never the one after it.
        time.sleep(0.05)
        assert len(requested) == wanted
    assert seen == total_pages >= 4 and len(requested) == seen
