"""The launcher of the test control plane itself."""

from __future__ import annotations

import socket

import pytest

from tests.controlplane import launcher


def test_a_port_taken_before_a_component_binds_it_starts_the_control_plane_again(monkeypatch, capsys):
    # free_port() lets the port go before etcd binds it; here another socket holds the first one it gives.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    real = launcher.free_port
    given: list[int] = []

    def first_one_taken() -> int:
        port = taken.getsockname()[1] if not given else real()
        given.append(port)
        return port

    monkeypatch.setattr(launcher, "free_port", first_one_taken)
    cp = launcher.ControlPlane()
    try:
        with cp:
            assert cp.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
        assert "a port was taken meanwhile, starting again" in capsys.readouterr().err
        assert "address already in use" in (cp.work_dir / "logs-attempt-1" / "etcd.log").read_text()
    finally:
        taken.close()
        cp.cleanup()


def test_another_start_failure_is_not_retried(monkeypatch):
    monkeypatch.setattr(launcher, "START_ATTEMPTS", 3)
    cp = launcher.ControlPlane()
    calls: list[int] = []

    def fails() -> None:
        calls.append(1)
        raise launcher.ControlPlaneError("etcd exited with 1 during start: some other reason")

    monkeypatch.setattr(cp, "start", fails)
    try:
        with pytest.raises(launcher.ControlPlaneError, match="some other reason"), cp:
            pass
        assert calls == [1]
    finally:
        cp.cleanup()
