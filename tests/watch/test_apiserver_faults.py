"""Faults on the Kubernetes side: the apiserver killed mid-watch, a forced 410, missing list rights."""

from __future__ import annotations

import io
import logging

import pytest
from django.core.management import call_command

from fleet.kube import streams
from tests.controlplane.kube import wait_for
from tests.watch.helpers import (
    compact_etcd,
    cursor_state,
    kill_apiserver,
    make,
    revive_components,
    start_apiserver,
    stored,
    verify,
    wait_converged,
)

pytestmark = pytest.mark.controlplane


def test_it_converges_after_the_apiserver_is_killed_and_restarted_mid_watch(control_plane, kube, watcher):
    watcher.start({"cp": str(control_plane.kubeconfig)}, kinds=("Node", "ResourceSlice"))
    wait_converged("cp", "Node")
    for i in range(20):
        kube.create(make("Node", f"n-{i}"))
    args = kill_apiserver(control_plane)  # some of those events are still in flight
    wait_for("a stream to notice", lambda: cursor_state("cp", "Node") == "backoff", timeout=30)
    start_apiserver(control_plane, args)
    for i in range(5):
        kube.delete("Node", f"n-{i}")
    kube.create(make("ResourceSlice", "after-restart"))
    wait_converged("cp", "Node")
    wait_converged("cp", "ResourceSlice")
    assert stored("cp", "ResourceSlice", "after-restart")
    assert not stored("cp", "Node", "n-0") and stored("cp", "Node", "n-19")
    wait_for("streams watching again", lambda: cursor_state("cp", "Node") == "watching", timeout=30)
    revive_components(control_plane)  # the controller manager may have given up meanwhile


def test_it_relists_after_410_and_deletes_what_vanished(control_plane, kube, watcher, caplog):
    for name in ("stays", "goes"):
        kube.create(make("Node", name))
    watcher.start({"cp": str(control_plane.kubeconfig)}, kinds=("Node",))
    wait_converged("cp", "Node")
    watcher.stop()
    # While nobody watches: a delete and a create, then the history is compacted away and the
    # apiserver's watch cache restarts empty, so resuming from our cursor must get 410 Gone.
    kube.delete("Node", "goes")
    kube.create(make("Node", "new"))
    compact_etcd(control_plane)
    args = kill_apiserver(control_plane)
    start_apiserver(control_plane, args)
    with caplog.at_level(logging.INFO, logger="fleet.kube.reflector"):
        watcher.start({"cp": str(control_plane.kubeconfig)}, kinds=("Node",))
        wait_converged("cp", "Node")
    assert "relisting" in caplog.text
    assert stored("cp", "Node", "new") and not stored("cp", "Node", "goes")


RBAC = "/apis/rbac.authorization.k8s.io/v1"
ROLE = "claimscope-watch-test"


def grant_list_watch(kube, resources: list[tuple[str, str]]) -> None:
    """Lets the restricted identity list and watch exactly ``resources`` ((group, plural) pairs)."""
    rules = [{"apiGroups": [g], "resources": [r], "verbs": ["list", "watch"]} for g, r in resources]
    kube.request("POST", f"{RBAC}/clusterroles", {"metadata": {"name": ROLE}, "rules": rules})
    binding = {
        "metadata": {"name": ROLE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
        "subjects": [{"kind": "User", "name": "restricted", "apiGroup": "rbac.authorization.k8s.io"}],
    }
    kube.request("POST", f"{RBAC}/clusterrolebindings", binding)


def revoke(kube) -> None:
    kube.request("DELETE", f"{RBAC}/clusterrolebindings/{ROLE}")
    kube.request("DELETE", f"{RBAC}/clusterroles/{ROLE}")


def test_a_kind_without_list_rights_is_forbidden_and_the_others_sync(control_plane, kube, namespace, watcher):
    allowed = [
        ("resource.k8s.io", "resourceslices"),
        ("resource.k8s.io", "resourceclaims"),
        ("resource.k8s.io", "deviceclasses"),
        ("resource.k8s.io", "devicetaintrules"),
        ("", "nodes"),
        ("", "pods"),
        ("", "events"),
    ]  # no resourceclaimtemplates
    grant_list_watch(kube, allowed)
    try:
        kube.create(make("Node", "visible"))
        watcher.start({"limited": str(control_plane.restricted_kubeconfig)})
        wait_for(
            "the template stream to be forbidden",
            lambda: cursor_state("limited", "ResourceClaimTemplate") == "forbidden",
            timeout=30,
        )
        for kind in streams.STREAM_KINDS:
            if kind != "ResourceClaimTemplate":
                wait_converged("limited", kind)
        assert stored("limited", "Node", "visible")
        out = io.StringIO()
        call_command("clusters", stdout=out)
        line = next(x for x in out.getvalue().splitlines() if "ResourceClaimTemplate" in x and "limited" in x)
        assert "forbidden" in line and 'User "restricted" cannot list' in line
        assert verify("limited", "Node")[0] == 0
    finally:
        revoke(kube)
