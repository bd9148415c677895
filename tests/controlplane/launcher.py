"""Starts a real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) on 127.0.0.1 for tests and for ``make cluster``.

The binaries come from ``tests/controlplane/build.sh`` (upstream Go modules, pinned in go.mod).
There are no kubelets: nodes are API objects created by the tests (see ``nodes.py``).

CLI: ``python -m tests.controlplane.launcher`` starts it, prints the kubeconfig path and runs
until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.controlplane.kube import Kube

HERE = Path(__file__).resolve().parent
SERVICE_CIDR = "10.0.0.0/24"

# DRA gates of k8s.io/kubernetes v1.37.2 (pkg/features/kube_features.go): every beta one, plus
# the alpha DRAResourcePoolStatus. GA gates are left alone: the locked ones (DynamicResource-
# Allocation, DRAAdminAccess, DRAPrioritizedList, DRAExtendedResource, DRAResourceClaimDeviceStatus)
# cannot be changed, and the unlocked ones (DRADeviceTaints, DRADeviceTaintRules) are on by default
# and only log "setting GA feature gate" when set.
FEATURE_GATES = {
    # beta in 1.37
    "DRAConsumableCapacity": True,
    "DRADeviceBindingConditions": True,
    "DRAPartitionableDevices": True,
    "DRAFractionalCapacityRange": True,
    "DRAResourceClaimGranularStatusAuthorization": True,
    "DRASchedulerFilterTimeout": True,
    # beta but off by default; needs GenericWorkload (beta, off) and scheduling.k8s.io/v1beta1
    "DRAWorkloadResourceClaims": True,
    "GenericWorkload": True,
    # alpha: ResourcePoolStatusRequest (resource.k8s.io/v1alpha3), useful to cross-check a dashboard
    "DRAResourcePoolStatus": True,
    # alpha: list-valued attributes (KEP-6072), published by the NVIDIA driver when its gate is on. With it
    # the scheduler uses the "experimental" structured allocator.
    "DRAListTypeAttributes": True,
}
RUNTIME_CONFIG = [
    "resource.k8s.io/v1beta1=true",
    "resource.k8s.io/v1beta2=true",
    "resource.k8s.io/v1alpha3=true",
    "scheduling.k8s.io/v1beta1=true",
]
# The node lifecycle controller would taint our kubelet-less nodes unreachable once their
# (never renewed) lease expires, and then nothing could be scheduled on them.
KCM_CONTROLLERS = "*,-node-lifecycle-controller"


@dataclass(frozen=True)
class Identity:
    """A static-token user; the token file is the apiserver's only authenticator besides certs."""

    user: str
    token: str
    groups: tuple[str, ...] = ()


class ControlPlaneError(RuntimeError):
    """A component failed to build or start; the message includes the tail of its log."""


def build_binaries() -> Path:
    """Runs build.sh (a no-op when the pinned binaries exist) and returns their directory."""
    result = subprocess.run(["bash", str(HERE / "build.sh")], capture_output=True, text=True)
    if result.returncode != 0:
        raise ControlPlaneError(f"build.sh failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


START_ATTEMPTS = 3  # starts of the control plane when a component finds its port taken (see __enter__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    # Linux PR_SET_PDEATHSIG: if the test process is killed hard, the components die too instead
    # of lingering with their ports bound.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class _Certs:
    """A throwaway CA, the apiserver serving certificate and the service-account key pair."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = directory / "ca.crt"
        self.serving_cert = directory / "apiserver.crt"
        self.serving_key = directory / "apiserver.key"
        self.sa_key = directory / "sa.key"
        self.sa_pub = directory / "sa.pub"

        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "claimscope-test-ca")])
        ca_cert = (
            self._builder(ca_name, ca_name, ca_key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [
            x509.DNSName(n)
            for n in ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc")
        ]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", "10.0.0.1")]
        cert = (
            self._builder(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
                ca_name,
                key.public_key(),
            )
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        sa_key = ec.generate_private_key(ec.SECP256R1())

        self.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        self.serving_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._write_key(self.serving_key, key)
        self._write_key(self.sa_key, sa_key)
        self.sa_pub.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    @staticmethod
    def _builder(
        subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        now = dt.datetime.now(dt.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=7))
        )

    @staticmethod
    def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler as local processes.

    Use as a context manager; every process is stopped on exit, also after an exception.
    ``log_dir`` holds one log file per component.
    """

    def __init__(self, bin_dir: Path | None = None, work_dir: Path | None = None) -> None:
        self._bin_dir = bin_dir
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="claimscope-controlplane-"))
        self.is_temporary = work_dir is None
        self.log_dir = self.work_dir / "logs"
        self.admin = Identity("admin", secrets.token_hex(16), ("system:masters",))
        # No groups: the apiserver adds only system:authenticated, so RBAC tests start from zero.
        self.restricted = Identity("restricted", secrets.token_hex(16))
        self._kcm = Identity("system:kube-controller-manager", secrets.token_hex(16))
        self._scheduler = Identity("system:kube-scheduler", secrets.token_hex(16))
        self.port = 0
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.startup_seconds = 0.0

    # -- public API -----------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def admin_token(self) -> str:
        return self.admin.token

    @property
    def ca_file(self) -> Path:
        return self.work_dir / "pki" / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.work_dir / "admin.kubeconfig"

    @property
    def restricted_kubeconfig(self) -> Path:
        return self.work_dir / "restricted.kubeconfig"

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            self._bin_dir = build_binaries()
        return self._bin_dir

    def client(self, identity: Identity | None = None) -> Kube:
        return Kube(self.url, (identity or self.admin).token, str(self.ca_file))

    def token_kubeconfig(self, token: str, path: Path) -> Path:
        """Writes a kubeconfig that authenticates to this control plane with a bearer ``token`` (a
        ServiceAccount's, from ``kubectl create token``); JSON is valid YAML."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "cp", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}
            ],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "cp", "user": "sa"}}],
            "current-context": "sa",
        }
        path.write_text(json.dumps(config))
        return path

    def kubectl(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Runs the pinned kubectl against this control plane (admin unless ``kubeconfig``)."""
        cmd = [str(self.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        result = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise ControlPlaneError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def __enter__(self) -> Self:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                self.start()
                return self
            except ControlPlaneError as err:
                self.stop()
                # free_port() lets a port go before the component binds it, and any process's outgoing
                # connection can take it in between: then start again on other ports.
                if "address already in use" not in str(err) or attempt == START_ATTEMPTS:
                    raise
                say = f"control plane start {attempt}: a port was taken meanwhile, starting again"
                print(say, file=sys.stderr)
                self.log_dir.rename(self.work_dir / f"logs-attempt-{attempt}")
                shutil.rmtree(self.work_dir / "etcd", ignore_errors=True)
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        bin_dir = self.bin_dir  # build before the clock starts
        started = time.monotonic()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        certs = _Certs(self.work_dir / "pki")
        tokens = self.work_dir / "tokens.csv"
        tokens.write_text(
            "".join(
                f'{i.token},{i.user},{i.user},"{",".join(i.groups)}"\n'
                for i in (self.admin, self.restricted, self._kcm, self._scheduler)
            )
        )
        tokens.chmod(0o600)
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in FEATURE_GATES.items())

        etcd_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        self._spawn(
            "etcd",
            [
                str(bin_dir / "etcd"),
                f"--data-dir={self.work_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
                # Test data is disposable; fsync dominates etcd latency on slow disks.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self._wait_healthy("etcd", f"{etcd_url}/health", timeout=30)

        self.port = free_port()
        self._spawn(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # The default reconciler refuses a loopback address for the kubernetes Service.
                "--endpoint-reconciler-type=none",
                f"--secure-port={self.port}",
                f"--cert-dir={self.work_dir / 'apiserver-certs'}",
                f"--tls-cert-file={certs.serving_cert}",
                f"--tls-private-key-file={certs.serving_key}",
                f"--client-ca-file={certs.ca}",
                f"--token-auth-file={tokens}",
                "--authorization-mode=Node,RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={certs.sa_pub}",
                f"--service-account-signing-key-file={certs.sa_key}",
                f"--feature-gates={gates}",
                f"--runtime-config={','.join(RUNTIME_CONFIG)}",
                "--v=1",
            ],
        )
        self._wait_healthy("kube-apiserver", f"{self.url}/readyz", timeout=90)
        self._write_kubeconfig(self.kubeconfig, self.admin)
        self._write_kubeconfig(self.restricted_kubeconfig, self.restricted)
        kcm_kubeconfig = self._write_kubeconfig(self.work_dir / "kcm.kubeconfig", self._kcm)
        sched_kubeconfig = self._write_kubeconfig(self.work_dir / "scheduler.kubeconfig", self._scheduler)

        kcm_port, sched_port = free_port(), free_port()
        self._spawn(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kcm_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--cert-dir={self.work_dir / 'kcm-certs'}",
                "--leader-elect=false",
                f"--controllers={KCM_CONTROLLERS}",
                # Each controller acts as its own service account, as in kubeadm clusters, so the
                # bootstrap RBAC roles are exercised the same way.
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={certs.sa_key}",
                f"--root-ca-file={certs.ca}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--feature-gates={gates}",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(bin_dir / "kube-scheduler"),
                f"--kubeconfig={sched_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={sched_port}",
                "--leader-elect=false",
                f"--feature-gates={gates}",
                "--v=2",
            ],
        )
        self._wait_healthy("kube-controller-manager", f"https://127.0.0.1:{kcm_port}/healthz", timeout=60)
        self._wait_healthy("kube-scheduler", f"https://127.0.0.1:{sched_port}/healthz", timeout=60)
        self.startup_seconds = time.monotonic() - started

    def stop(self) -> None:
        """Stops the components newest first, each with SIGTERM and SIGKILL after 10 s.

        One at a time: kube-apiserver's graceful shutdown hangs if etcd is already gone.
        """
        while self._procs:
            _, proc = self._procs.pop()
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def cleanup(self) -> None:
        """Removes the work directory (data, certs, logs) if this object created it."""
        if self.is_temporary:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for log in sorted(self.log_dir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name} (last {len(tail)} lines)\n" + "\n".join(tail))
        return "\n".join(out)

    # -- internals ------------------------------------------------------------------------

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                # Own session: a Ctrl-C in `make cluster` reaches only the launcher, which then
                # stops the components in order.
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._procs.append((name, proc))

    def _wait_healthy(self, name: str, url: str, timeout: float) -> None:
        proc = next(p for n, p in self._procs if n == name)
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        if not url.startswith(self.url):
            # kcm and scheduler serve with self-signed certificates of their own.
            ctx = ssl._create_unverified_context()
        headers = {"Authorization": f"Bearer {self.admin.token}"} if url.startswith(self.url) else {}
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with {proc.returncode} during start\n{self.log_tail(40)}"
                )
            try:
                req = urllib.request.Request(url, headers=headers)
                with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code}: {err.read().decode(errors='replace')[-2000:]}"
            except OSError as err:
                last = repr(err)
            time.sleep(0.2)
        raise ControlPlaneError(f"{name} not healthy after {timeout}s at {url}: {last}\n{self.log_tail(40)}")

    def _write_kubeconfig(self, path: Path, identity: Identity) -> Path:
        # JSON is valid YAML, so no YAML dependency is needed here.
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "claimscope-test",
                            "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)},
                        }
                    ],
                    "users": [{"name": identity.user, "user": {"token": identity.token}}],
                    "contexts": [
                        {
                            "name": "claimscope-test",
                            "context": {"cluster": "claimscope-test", "user": identity.user},
                        }
                    ],
                    "current-context": "claimscope-test",
                },
                indent=2,
            )
        )
        path.chmod(0o600)
        return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bin-dir", type=Path, help="use these binaries instead of running build.sh")
    parser.add_argument("--work-dir", type=Path, help="data/log directory (default: a new temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the temp work dir (data, logs)")
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    cp = ControlPlane(bin_dir=args.bin_dir, work_dir=args.work_dir)
    try:
        with cp:
            print(f"control plane ready in {cp.startup_seconds:.1f}s at {cp.url}", file=sys.stderr)
            print(f"logs: {cp.log_dir}", file=sys.stderr)
            print(f"restricted kubeconfig: {cp.restricted_kubeconfig}", file=sys.stderr)
            print(f"export KUBECONFIG={cp.kubeconfig}", file=sys.stderr)
            print(cp.kubeconfig, flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
    except ControlPlaneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        if args.keep or not cp.is_temporary:
            print(f"stopped; work dir kept at {cp.work_dir}", file=sys.stderr)
        else:
            cp.cleanup()
    return 0


def _interrupt(signum: int, frame: object) -> None:
    # SIGTERM (e.g. from a supervising make or CI job) takes the same orderly path as Ctrl-C. SIGINT
    # is set too because a shell may start background jobs with it ignored.
    raise KeyboardInterrupt


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
