"""CLAIMSCOPE_VISIBILITY=kubernetes on the real control plane: a user sees the namespaces where the cluster's
RBAC lets their identity (username, groups) list ResourceClaims, asked with SubjectAccessReviews through a
service account that may create those and nothing else. Roles, RoleBindings to the user and to a group, a
ClusterRoleBinding, and a binding removed while the user is logged in."""

from __future__ import annotations

import csv
import io
import secrets
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.management import call_command
from rest_framework.test import APIClient

from fleet import ingest
from fleet.models import KubeIdentity, NamespaceGrant, Pod, ResourceClaim, SchedulingEvent
from tests.security.test_oidc import Issuer, claimscope, issuer, sso_login  # noqa: F401  (issuer: a fixture)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "fleet-small.yaml"
CLUSTER = "rbac"
USER = "carol@example.org"
GROUP = "team-b"


def apply(control_plane, *docs: dict) -> None:
    control_plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))


def delete(control_plane, kind: str, name: str, namespace: str = "") -> None:
    args = ["delete", kind, name, "--wait=false"] + (["-n", namespace] if namespace else [])
    control_plane.kubectl(*args)


def role(name: str, namespace: str, resources: list[str]) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": [{"apiGroups": ["resource.k8s.io"], "resources": resources, "verbs": ["get", "list"]}],
    }


def binding(name: str, namespace: str, role_name: str, kind: str, subject: str) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": subject}],
    }


@pytest.fixture
def reviewer(control_plane, namespace, tmp_path) -> Iterator[Path]:
    """A kubeconfig of a service account allowed to create SubjectAccessReviews and nothing else."""
    name = f"claimscope-sar-{secrets.token_hex(3)}"
    apply(
        control_plane,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [
                {
                    "apiGroups": ["authorization.k8s.io"],
                    "resources": ["subjectaccessreviews"],
                    "verbs": ["create"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    token = control_plane.kubectl("create", "token", name, "-n", namespace, "--duration=10m").stdout.strip()
    kubeconfig = tmp_path / "reviewer.kubeconfig"
    control_plane.token_kubeconfig(token, kubeconfig)
    # The reviewer itself may not read what it asks about.
    sa = f"system:serviceaccount:{namespace}:{name}"
    can = control_plane.kubectl(
        "auth", "can-i", "list", "resourceclaims.resource.k8s.io", "-A", f"--as={sa}", check=False
    )
    assert can.stdout.strip() == "no"
    yield kubeconfig
    delete(control_plane, "clusterrolebinding", name)
    delete(control_plane, "clusterrole", name)


@pytest.fixture
def two_namespaces(control_plane, kube, namespace) -> Iterator[tuple[str, str]]:
    other = kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"generateName": "t-"}})
    name = other["metadata"]["name"]
    yield namespace, name
    kube.delete("Namespace", name)


def import_fleet(mine: str, team: str) -> None:
    call_command("import_snapshot", str(FIXTURE), cluster=CLUSTER, stdout=StringIO())
    call_command("import_snapshot", str(FIXTURE), cluster="fixtures", stdout=StringIO())
    for model in (ResourceClaim, Pod, SchedulingEvent):
        rows = model.objects.filter(cluster__name=CLUSTER)
        rows.filter(namespace="research").update(namespace=mine)
        rows.filter(namespace="ml-train").update(namespace=team)


@pytest.fixture
def rbac_fleet(two_namespaces, reviewer, settings, monkeypatch):
    """The fixture fleet as cluster "rbac", its research/ml-train objects moved to the two real namespaces;
    also the same fleet as cluster "fixtures", which keeps namespace grants."""
    mine, team = two_namespaces
    import_fleet(mine, team)
    monkeypatch.setenv("CLAIMSCOPE_CLUSTERS", f"{CLUSTER}=kubeconfig:{reviewer}")
    settings.CLAIMSCOPE_VISIBILITY = "kubernetes"
    settings.CLAIMSCOPE_RBAC_CLUSTERS = [CLUSTER]
    settings.CLAIMSCOPE_RBAC_CACHE_SECONDS = 30
    cache.clear()
    yield mine, team
    cache.clear()


def seen(client: APIClient, cluster: str = CLUSTER) -> set[str]:
    response = client.get("/api/v1/claims/", {"cluster": cluster, "page_size": "1000"})
    assert response.status_code == 200, response.content[:300]
    return {r["namespace"] for r in response.json()["results"]}


def test_namespaces_follow_the_clusters_rbac_for_the_users_identity(control_plane, rbac_fleet):
    mine, team = rbac_fleet
    carol = get_user_model().objects.create_user("oidc-carol")
    KubeIdentity.objects.create(user=carol, username=USER, groups=[GROUP, "system:authenticated"])
    NamespaceGrant.objects.create(user=carol, cluster=None, namespace="inference")  # grants: other clusters
    client = APIClient()
    client.force_login(carol)
    assert seen(client) == set()  # no binding yet: secure by default

    apply(
        control_plane,
        role("claims-reader", mine, ["resourceclaims"]),
        binding("carol", mine, "claims-reader", "User", USER),
        role("claims-reader", team, ["resourceclaims"]),
        binding("team-b", team, "claims-reader", "Group", GROUP),
        role("templates-only", team, ["resourceclaimtemplates"]),  # not what visibility asks about
    )
    cache.clear()
    assert seen(client) == {mine, team}
    # Namespace grants still decide the clusters without shared identity, and only those.
    assert seen(client, "fixtures") == {"inference"}
    assert "inference" not in seen(client)
    # The same rules for CSV, events and the triage report.
    body = client.get("/api/v1/events/", {"cluster": CLUSTER, "format": "csv"}).content.decode()
    assert {r["namespace"] for r in csv.DictReader(io.StringIO(body))} <= {mine, team}
    triage = client.get("/api/v1/triage/", {"since": "2020-01-01T00:00:00Z", "cluster": CLUSTER}).json()
    named = {p["namespace"] for p in triage["pended"]} | {x["namespace"] for x in triage["leaks"]}
    assert named <= {mine, team}

    # The group's binding goes while carol is logged in: after the short cache, its namespace is hidden.
    delete(control_plane, "rolebinding", "team-b", team)
    assert seen(client) == {mine, team}  # cached answer (CLAIMSCOPE_RBAC_CACHE_SECONDS)
    cache.clear()  # the cache expiring, without waiting for it
    assert seen(client) == {mine}
    hidden = ResourceClaim.objects.filter(namespace=team, cluster__name=CLUSTER).values_list("pk", flat=True)
    assert client.get(f"/api/v1/claims/{hidden[0]}/").status_code == 404


def test_a_cluster_wide_binding_shows_every_namespace_and_no_identity_shows_none(control_plane, rbac_fleet):
    mine, team = rbac_fleet
    name = f"claims-all-{secrets.token_hex(3)}"
    apply(
        control_plane,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "sre"}],
        },
    )
    try:
        users = get_user_model().objects
        sre, nobody = users.create_user("oidc-sre"), users.create_user("local-user")
        KubeIdentity.objects.create(user=sre, username="sam@example.org", groups=["sre"])
        NamespaceGrant.objects.create(
            user=nobody, cluster=ingest.get_or_create_cluster(CLUSTER), namespace=mine
        )
        as_sre, as_nobody = APIClient(), APIClient()
        as_sre.force_login(sre)
        as_nobody.force_login(nobody)
        every = set(ResourceClaim.objects.filter(cluster__name=CLUSTER).values_list("namespace", flat=True))
        assert seen(as_sre) == every and {mine, team} <= every
        # Without an SSO identity, an RBAC cluster shows nothing: its grants are not consulted there.
        assert seen(as_nobody) == set()
    finally:
        delete(control_plane, "clusterrolebinding", name)
        delete(control_plane, "clusterrole", name)


def test_an_unreachable_cluster_shows_nothing(rbac_fleet, monkeypatch, tmp_path, caplog):
    carol = get_user_model().objects.create_user("oidc-carol")
    KubeIdentity.objects.create(user=carol, username=USER, groups=[])
    monkeypatch.setenv("CLAIMSCOPE_CLUSTERS", f"{CLUSTER}=kubeconfig:{tmp_path / 'missing'}")
    client = APIClient()
    client.force_login(carol)
    assert seen(client) == set()
    assert f"visibility: cannot ask cluster {CLUSTER} about user='{USER}'" in caplog.text


def test_the_oidc_login_stores_the_identity_the_cluster_would_derive(settings):
    from fleet.access.grants import sync_kube_identity

    settings.CLAIMSCOPE_RBAC_USERNAME_CLAIM = "email"
    settings.CLAIMSCOPE_RBAC_USERNAME_PREFIX = "oidc:"
    settings.CLAIMSCOPE_RBAC_GROUPS_PREFIX = "oidc:"
    user = get_user_model().objects.create_user("oidc-x")
    sync_kube_identity(user, {"sub": "x", "email": "x@example.org", "groups": ["b", "a"]})
    identity = KubeIdentity.objects.get(user=user)
    assert (identity.username, identity.groups) == ("oidc:x@example.org", ["oidc:a", "oidc:b"])
    sync_kube_identity(user, {"sub": "x"})  # no username claim any more: no identity
    assert not KubeIdentity.objects.filter(user=user).exists()


@pytest.mark.django_db(transaction=True)
def test_an_sso_user_sees_what_the_clusters_rbac_grants_their_oidc_identity(
    issuer: Issuer,  # noqa: F811  (the fixture imported above)
    control_plane,
    reviewer,
    two_namespaces,
) -> None:
    """End to end: claimscope as a server process, SSO through the test issuer (e-mail sam@example.org, its
    group claim is "namespaces": ["research"]), the control plane's RBAC deciding, a binding removed while
    the user is logged in."""
    mine, team = two_namespaces
    import_fleet(mine, team)
    apply(
        control_plane,
        role("claims-reader", mine, ["resourceclaims"]),
        binding("sam", mine, "claims-reader", "User", "sam@example.org"),
        role("claims-reader", team, ["resourceclaims"]),
        binding("research", team, "claims-reader", "Group", "research"),
    )
    env = {
        "CLAIMSCOPE_VISIBILITY": "kubernetes",
        "CLAIMSCOPE_CLUSTERS": f"{CLUSTER}=kubeconfig:{reviewer}",
        "CLAIMSCOPE_RBAC_GROUPS_CLAIM": "namespaces",
        "CLAIMSCOPE_RBAC_CACHE_SECONDS": "0",  # the removal below shows on the next request
    }
    with claimscope(issuer, **env) as (base, _):
        browser, done = sso_login(base)
        assert done.url == f"{base}/", done.url

        def namespaces(fmt: str = "json") -> set[str]:
            url = f"{base}/api/v1/claims/?cluster={CLUSTER}&page_size=1000&format={fmt}"
            response = browser.get(url, timeout=30)
            assert response.status_code == 200, response.text[:300]
            if fmt == "csv":
                return {r["namespace"] for r in csv.DictReader(io.StringIO(response.text))}
            return {r["namespace"] for r in response.json()["results"]}

        assert namespaces() == {mine, team} == namespaces("csv")
        delete(control_plane, "rolebinding", "research", team)
        assert namespaces() == {mine}
        page = browser.get(f"{base}/claims/pending/?cluster={CLUSTER}", timeout=30)
        assert page.status_code == 200 and team not in page.text
    identity = KubeIdentity.objects.get()
    assert (identity.username, identity.groups) == ("sam@example.org", ["research"])
