"""pytest plumbing for tests against the real control plane (see launcher.py); loaded for the whole
session by the root conftest.py.

The control plane is built (if needed) and started once per session. A failure to build or start
fails every test that uses it, loudly, with the log tail: these tests are never skipped.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from tests.controlplane.kube import ApiError, Kube, wait_for
from tests.controlplane.launcher import ControlPlane, ControlPlaneError

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / ".artifacts" / "controlplane-logs"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # Fixtures read this to decide whether to keep diagnostics for the test that just ran.
    report = yield
    if report.failed:
        item.stash[_FAILED] = True
    return report


_FAILED = pytest.StashKey[bool]()


def _keep_logs(cp: ControlPlane, reason: str) -> None:
    if ARTIFACTS.exists():
        shutil.rmtree(ARTIFACTS)
    shutil.copytree(cp.log_dir, ARTIFACTS)
    (ARTIFACTS / "REASON").write_text(reason + "\n")


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """The running control plane: ``.url``, ``.kubeconfig``, ``.restricted_kubeconfig``,
    ``.admin_token``, ``.kubectl(*args)``, ``.client()``."""
    cp = ControlPlane()
    try:
        cp.__enter__()
    except ControlPlaneError as err:
        if cp.log_dir.exists():
            _keep_logs(cp, f"start failed: {err}")
        pytest.fail(f"the test control plane did not start:\n{err}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()
        failed = request.session.testsfailed
        if failed:
            _keep_logs(cp, f"{failed} test(s) failed")
        cp.cleanup()


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[Kube]:
    """An admin client. Cluster-scoped test objects (ResourceSlices, DeviceClasses, DeviceTaintRules,
    Nodes) are deleted after the test, so every test starts from an empty fleet."""
    client = control_plane.client()
    yield client
    for kind in ("ResourceSlice", "DeviceClass", "DeviceTaintRule"):
        client.delete_collection(kind)
    for node in client.list("Node"):
        client.delete("Node", node["metadata"]["name"])


@pytest.fixture
def namespace(request: pytest.FixtureRequest, control_plane: ControlPlane, kube: Kube) -> Iterator[str]:
    """A fresh namespace, ready for pods (its default ServiceAccount exists).

    Teardown waits until the namespace's ResourceClaims are gone: a claim that still holds an
    allocation would make devices of the next test's fleet (same pool names) look taken.
    """
    ns = kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"generateName": "t-"}})
    name: str = ns["metadata"]["name"]
    # The ServiceAccount admission plugin rejects pods until the controller has created it.
    wait_for("default ServiceAccount", lambda: kube.get("ServiceAccount", "default", name), timeout=30)
    yield name

    if request.node.stash.get(_FAILED, False):
        dump = control_plane.kubectl(
            "get", "pods,resourceclaims,resourceclaimtemplates,events", "-n", name, "-o", "yaml", check=False
        )
        slices = control_plane.kubectl("get", "nodes,resourceslices,deviceclasses", "-o", "yaml", check=False)
        (control_plane.log_dir / f"objects-{request.node.name}.yaml").write_text(
            dump.stdout + dump.stderr + slices.stdout + slices.stderr
        )
    # No kubelet confirms termination of bound pods, so they must be force-deleted.
    kube.request("DELETE", kube.path("Pod", namespace=name), query={"gracePeriodSeconds": "0"})
    kube.delete_collection("ResourceClaim", name)
    wait_for(
        f"ResourceClaims in {name} to be released and deleted",
        lambda: not kube.list("ResourceClaim", name),
        timeout=60,
    )
    # Namespace deletion is best-effort; the claims (the part that matters) are gone.
    with contextlib.suppress(ApiError):
        kube.delete("Namespace", name)
