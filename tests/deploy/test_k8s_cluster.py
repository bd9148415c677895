"""The k8s/ manifests against a real kube-apiserver: they are accepted, the pods meet the "restricted"
Pod Security Standard, and the ServiceAccount reads exactly what the watchers mirror, nothing more."""

from __future__ import annotations

import copy
import datetime as dt
import threading
from pathlib import Path

import pytest
import yaml

from fleet import ingest
from fleet.kube.kubesource import RESOURCES, KubeSource
from fleet.kube.reflector import Reflector, StreamConfig
from fleet.models import Cluster, WatchCursor
from simulator import nvidia
from tests.controlplane.kube import ApiError, Kube
from tests.controlplane.launcher import ControlPlane
from tests.controlplane.nodes import for_create
from tests.controlplane.publisher import FleetPublisher

pytestmark = pytest.mark.controlplane

BASE = Path(__file__).resolve().parents[2] / "k8s" / "base"
NS = "claimscope"
SA = f"system:serviceaccount:{NS}:claimscope"
RBAC_KINDS = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
# (resource, API group) of every kind the watchers list and watch.
WATCHED = [
    (r.plural, r.prefix.removeprefix("/apis/").split("/")[0] if "/apis/" in r.prefix else "")
    for r in RESOURCES.values()
]


@pytest.fixture(scope="module")
def manifests(control_plane: ControlPlane) -> list[dict]:
    built = control_plane.kubectl("kustomize", str(BASE)).stdout
    return [doc for doc in yaml.safe_load_all(built) if doc]


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, manifests: list[dict]):
    """The namespace, ServiceAccount and RBAC objects really applied (server-side)."""
    docs = [d for d in manifests if d["kind"] in RBAC_KINDS]
    control_plane.kubectl(
        "apply",
        "--server-side",
        "--field-manager=claimscope-tests",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(docs),
    )
    yield
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            control_plane.kubectl("delete", doc["kind"], doc["metadata"]["name"], "--wait=false", check=False)


def can_i(control_plane: ControlPlane, *args: str) -> bool:
    result = control_plane.kubectl("auth", "can-i", *args, f"--as={SA}", check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stderr
    return result.stdout.strip() == "yes"


def test_every_manifest_passes_a_server_side_dry_run_without_warnings(control_plane, manifests, installed):
    result = control_plane.kubectl(
        "apply",
        "--server-side",
        "--field-manager=claimscope-tests",
        "--dry-run=server",
        "-k",
        str(BASE),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # PodSecurity "warn: restricted" on the namespace would print a warning for a non-compliant template.
    assert "Warning" not in result.stderr, result.stderr
    for doc in manifests:
        kind = doc["kind"].lower()
        assert f"{kind}/{doc['metadata']['name']}" in result.stdout.replace(".apps/", "/").replace(
            ".rbac.authorization.k8s.io/", "/"
        ).replace(".networking.k8s.io/", "/"), f"{kind} {doc['metadata']['name']} not applied"


def deployment_pods(manifests: list[dict]) -> dict[str, dict]:
    pods = {}
    for doc in manifests:
        if doc["kind"] == "Deployment":
            template = copy.deepcopy(doc["spec"]["template"])
            pods[doc["metadata"]["name"]] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": doc["metadata"]["name"], "namespace": NS, **template["metadata"]},
                "spec": template["spec"],
            }
    return pods


def test_the_web_worker_and_beat_pods_are_admitted_under_the_restricted_pod_security_standard(
    control_plane, manifests, installed
):
    pods = deployment_pods(manifests)
    assert set(pods) == {"web", "worker-watch", "worker", "worker-diagnosis", "beat"}
    for name, pod in pods.items():
        result = control_plane.kubectl(
            "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod), check=False
        )
        assert result.returncode == 0, f"{name}: {result.stderr}"
    # The check is real: the same pod without its securityContext is refused.
    loose = copy.deepcopy(pods["web"])
    for container in loose["spec"]["containers"]:
        container.pop("securityContext")
    result = control_plane.kubectl(
        "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(loose), check=False
    )
    assert result.returncode != 0
    assert "violates PodSecurity" in result.stderr


@pytest.mark.parametrize(("resource", "group"), WATCHED)
def test_the_service_account_may_get_list_and_watch_every_watched_kind(
    control_plane, installed, resource, group
):
    qualified = f"{resource}.{group}" if group else resource
    for verb in ("get", "list", "watch"):
        assert can_i(control_plane, verb, qualified, "--all-namespaces"), f"cannot {verb} {qualified}"


@pytest.mark.parametrize(
    "request_",
    [
        ("get", "secrets", "--all-namespaces"),
        ("list", "secrets", "-n", NS),
        ("get", "configmaps", "-n", "kube-system"),
        ("create", "pods", "-n", NS),
        ("delete", "pods", "-n", "default"),
        ("create", "pods", "--subresource=exec", "-n", "default"),
        ("get", "pods", "--subresource=exec", "-n", "default"),
        ("get", "pods", "--subresource=log", "-n", "default"),
        ("patch", "nodes"),
        ("update", "resourceslices.resource.k8s.io"),
        ("create", "resourceclaims.resource.k8s.io", "-n", "default"),
        ("delete", "deviceclasses.resource.k8s.io"),
        ("update", "resourceclaims.resource.k8s.io", "--subresource=status", "-n", "default"),
        ("create", "serviceaccounts", "--subresource=token", "-n", NS),
        ("impersonate", "users"),
        ("*", "*"),
    ],
    ids=lambda r: " ".join(
        a.removeprefix("--subresource=") for a in r if not a.startswith("-") or "sub" in a
    ),
)
def test_the_service_account_cannot_read_secrets_write_or_exec(control_plane, installed, request_):
    assert not can_i(control_plane, *request_)


def resource_permissions(control_plane: ControlPlane, user: str) -> dict[str, set[str]]:
    """``kubectl auth can-i --list`` as ``user``: resource -> verbs (non-resource URLs left out)."""
    listed = control_plane.kubectl("auth", "can-i", "--list", f"--as={user}", "--no-headers").stdout
    granted: dict[str, set[str]] = {}
    for line in listed.splitlines():
        if line and not line[0].isspace():
            resource = line.split()[0]
            granted.setdefault(resource, set()).update(line.rsplit("[", 1)[1].rstrip("]").split())
    return granted


def test_the_service_account_has_no_permission_beyond_reading_the_watched_kinds(control_plane, installed):
    # What any authenticated identity gets by default (self reviews, discovery, cluster trust bundles).
    baseline = resource_permissions(control_plane, f"system:serviceaccount:{NS}:nobody")
    granted = resource_permissions(control_plane, SA)
    extra = {r: verbs - baseline.get(r, set()) for r, verbs in granted.items()}
    extra = {r: verbs for r, verbs in extra.items() if verbs}
    assert extra == {f"{r}.{g}" if g else r: {"get", "list", "watch"} for r, g in WATCHED}


@pytest.fixture
def sa_source(control_plane: ControlPlane, installed, tmp_path) -> tuple[KubeSource, Kube]:
    """A KubeSource and a raw client authenticated with a fresh token of the ServiceAccount (TokenRequest)."""
    token = control_plane.kubectl("create", "token", "claimscope", "-n", NS, "--duration=10m").stdout.strip()
    kubeconfig = tmp_path / "sa.kubeconfig"
    control_plane.token_kubeconfig(token, kubeconfig)
    return KubeSource.from_kubeconfig(str(kubeconfig)), Kube(
        control_plane.url, token, str(control_plane.ca_file)
    )


def seed(kube: Kube, namespace: str, tag: str) -> dict[str, str]:
    """One object of every watched kind, created as admin; returns kind -> name."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    node = f"gpu-{tag}"
    publisher = FleetPublisher(kube)
    slices = publisher.gpu_node(node, "B200", gpus=1)
    device_class = kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"claimscope-test-{tag}"},
            "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]},
        }
    )
    spec = {"devices": {"requests": [nvidia.exactly_request("gpu", "gpu.nvidia.com")]}}
    template = kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": f"tpl-{tag}", "namespace": namespace},
            "spec": {"spec": spec},
        }
    )
    claim = kube.create(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"claim-{tag}", "namespace": namespace},
            "spec": spec,
        }
    )
    pod = kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"job-{tag}", "namespace": namespace},
            "spec": {
                # Gated: the scheduler leaves it alone, so nothing changes under the test.
                "schedulingGates": [{"name": "claimscope.test/hold"}],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim["metadata"]["name"]}],
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        }
    )
    event = kube.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"job-{tag}.1", "namespace": namespace},
            "involvedObject": {
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "namespace": namespace,
                "uid": pod["metadata"]["uid"],
            },
            "reason": "FailedScheduling",
            "message": "0/1 nodes are available: 1 cannot allocate all claims.",
            "type": "Warning",
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": "default-scheduler"},
        }
    )
    # A rule on a pool nobody publishes: listed and watched like every kind, tainting nothing.
    taint = {"key": "claimscope.test/maintenance", "effect": "NoSchedule"}
    rule = kube.create(
        for_create(nvidia.device_taint_rule(f"rule-{tag}", taint, driver="gpu.nvidia.com", pool=f"no-{tag}"))
    )
    return {
        "DeviceTaintRule": rule["metadata"]["name"],
        "Node": node,
        "ResourceSlice": slices[0]["metadata"]["name"],
        "DeviceClass": device_class["metadata"]["name"],
        "ResourceClaimTemplate": template["metadata"]["name"],
        "ResourceClaim": claim["metadata"]["name"],
        "Pod": pod["metadata"]["name"],
        "Event": event["metadata"]["name"],
    }


def stored_names(cluster: Cluster, kind: str) -> set[str]:
    return set(
        ingest.SPECS[kind].model._default_manager.filter(cluster=cluster).values_list("name", flat=True)
    )


@pytest.mark.django_db
def test_the_watchers_list_and_watch_every_kind_with_the_service_account_token(sa_source, kube, namespace):
    source, _ = sa_source
    cluster = Cluster.objects.create(name="in-cluster")
    listed = seed(kube, namespace, "a")
    config = StreamConfig(watch_timeout=1.0, flush_interval=0.05, idle_timeout=30.0)
    reflectors = {kind: Reflector(cluster, kind, source, config) for kind in RESOURCES}
    versions = {kind: r.relist() for kind, r in reflectors.items()}
    # Created after the lists: only the watches (resumed from the lists' versions) can bring these in.
    watched = seed(kube, namespace, "b")
    for kind, reflector in reflectors.items():
        reflector.watch(versions[kind], threading.Event())
    for kind in RESOURCES:
        assert {listed[kind], watched[kind]} <= stored_names(cluster, kind), kind
    states = dict(WatchCursor.objects.filter(cluster=cluster).values_list("kind", "state"))
    assert set(states) == set(RESOURCES)
    assert "forbidden" not in states.values()


def test_the_service_account_token_is_refused_secrets_writes_and_exec(sa_source, namespace):
    _, as_sa = sa_source
    as_sa.request("GET", "/apis/resource.k8s.io/v1/resourceslices")  # allowed: no exception
    refused = [
        ("GET", "/api/v1/secrets", None),
        ("GET", f"/api/v1/namespaces/{NS}/configmaps", None),
        (
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}},
        ),
        ("DELETE", "/apis/resource.k8s.io/v1/deviceclasses/anything", None),
        ("POST", f"/api/v1/namespaces/{namespace}/pods/any/exec?command=id", None),
    ]
    for method, path, body in refused:
        with pytest.raises(ApiError) as err:
            as_sa.request(method, path, body)
        assert err.value.code == 403, (method, path, err.value)


def deployments(manifests: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in manifests if d["kind"] == "Deployment"}


def test_every_container_has_a_read_only_root_filesystem_and_a_writable_tmp_only(manifests):
    for name, deployment in deployments(manifests).items():
        spec = deployment["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        for container in spec["containers"] + spec.get("initContainers", []):
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, (name, container["name"])
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"]["drop"] == ["ALL"]
            assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp"]
            assert "memory" in container["resources"]["limits"]


def test_only_the_watchers_carry_a_kubernetes_token(manifests):
    mounted = {
        name: d["spec"]["template"]["spec"].get("automountServiceAccountToken")
        for name, d in deployments(manifests).items()
    }
    assert mounted == {
        "web": False,
        "worker": False,
        "worker-diagnosis": False,
        "beat": False,
        "worker-watch": True,
    }
    watch = deployments(manifests)["worker-watch"]["spec"]["template"]["spec"]
    assert watch["serviceAccountName"] == "claimscope"
    service_account = next(d for d in manifests if d["kind"] == "ServiceAccount")
    assert service_account["automountServiceAccountToken"] is False


def test_the_roles_run_the_right_commands_with_probes(manifests):
    by_name = deployments(manifests)
    web = by_name["web"]["spec"]["template"]["spec"]
    assert web["containers"][0]["command"][:2] == ["uvicorn", "dashboard.asgi:application"]
    assert web["initContainers"][0]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    paths = {
        p: web["containers"][0][p]["httpGet"]["path"]
        for p in ("startupProbe", "readinessProbe", "livenessProbe")
    }
    assert paths == {"startupProbe": "/healthz", "readinessProbe": "/readyz", "livenessProbe": "/healthz"}
    queues = {}
    for name in ("worker-watch", "worker", "worker-diagnosis"):
        container = by_name[name]["spec"]["template"]["spec"]["containers"][0]
        queue = next(a for a in container["command"] if a.startswith("--queues=")).split("=")[1]
        queues[queue] = name
        assert "CLAIMSCOPE_WORKER_ALIVE_FILE" in container["livenessProbe"]["exec"]["command"][-1]
        assert {e["name"]: e["value"] for e in container["env"]}["CLAIMSCOPE_WORKER_ALIVE_FILE"].startswith(
            "/tmp/"
        )
    assert queues == {"watch": "worker-watch", "celery": "worker", "diagnosis": "worker-diagnosis"}
    # The diagnoses' fleets live in one process: one replica, its tasks as threads.
    diagnosis = by_name["worker-diagnosis"]
    assert diagnosis["spec"]["replicas"] == 1
    assert "--pool=threads" in diagnosis["spec"]["template"]["spec"]["containers"][0]["command"]
    # The watch streams run as threads of one process, enough for two clusters' seven streams each.
    watch = by_name["worker-watch"]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--pool=threads" in watch
    assert int(next(a for a in watch if a.startswith("--concurrency=")).split("=")[1]) >= 14
    beat = by_name["beat"]
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    assert beat["spec"]["template"]["spec"]["containers"][0]["command"][:3] == [
        "celery",
        "--app=dashboard",
        "beat",
    ]
    assert by_name["web"]["spec"]["replicas"] >= 2


def test_secrets_are_referenced_never_shipped(manifests):
    assert not [d for d in manifests if d["kind"] == "Secret"]
    config = next(d for d in manifests if d["kind"] == "ConfigMap")["data"]
    assert not {"SECRET_KEY", "DATABASE_URL", "REDIS_URL"} & set(config)
    for deployment in deployments(manifests).values():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert {"secretRef": {"name": "claimscope"}} in container["envFrom"]


def test_network_policies_deny_by_default_and_open_only_the_web_port(manifests):
    policies = {d["metadata"]["name"]: d["spec"] for d in manifests if d["kind"] == "NetworkPolicy"}
    assert policies["default-deny"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    ingress = [p for p in policies.values() if "ingress" in p]
    assert len(ingress) == 1
    assert ingress[0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "web"
    assert ingress[0]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8000}]
