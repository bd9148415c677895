"""Cluster configuration, the CLI's answers to bad input, and the stream lock (on the real Redis)."""

from __future__ import annotations

import threading

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command

from fleet import clusters
from fleet.kube.lock import Heartbeat, StreamLock
from tests.controlplane.kube import wait_for


def test_it_parses_kubeconfig_contexts_and_in_cluster_entries():
    parsed = clusters.parse(" prod=kubeconfig:/etc/kube/config#prod-ctx , lab=incluster,dev=kubeconfig:/k ")
    assert [(c.name, c.mode, c.kubeconfig, c.context) for c in parsed] == [
        ("prod", "kubeconfig", "/etc/kube/config", "prod-ctx"),
        ("lab", "incluster", "", ""),
        ("dev", "kubeconfig", "/k", ""),
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("prod", "is not name=source"),
        ("Prod=incluster", "must be a lowercase DNS label"),
        ("a=incluster,a=incluster", "listed twice"),
        ("a=ftp://x", "unknown source"),
        ("a=kubeconfig:", "kubeconfig path missing"),
    ],
)
def test_a_bad_cluster_entry_is_an_error_naming_it(value, message):
    with pytest.raises(clusters.ClusterConfigError, match=message):
        clusters.parse(value)


def test_verify_names_an_unknown_cluster(monkeypatch, db):
    monkeypatch.setenv(clusters.ENV, "prod=incluster")
    with pytest.raises(CommandError, match=r"unknown cluster 'nope' \(configured: prod\)"):
        call_command("verify", "--cluster", "nope")


def test_watch_names_a_missing_kubeconfig(monkeypatch, db):
    monkeypatch.setenv(clusters.ENV, "prod=kubeconfig:/does/not/exist")
    with pytest.raises(CommandError, match="kubeconfig /does/not/exist"):
        call_command("watch")


def test_clusters_explains_how_to_configure_when_there_are_none(monkeypatch, db, capsys):
    monkeypatch.delenv(clusters.ENV, raising=False)
    call_command("clusters")
    assert "set CLAIMSCOPE_CLUSTERS" in capsys.readouterr().out


@pytest.fixture
def client():
    if not settings.REDIS_URL:
        pytest.fail("the lock tests need Redis: set REDIS_URL")
    conn = redis.Redis.from_url(settings.REDIS_URL)
    conn.delete("claimscope:stream:t:Node")
    yield conn
    conn.delete("claimscope:stream:t:Node")


def test_a_held_stream_lock_refuses_a_second_owner(client):
    first = StreamLock(client, "t", "Node", ttl=10)
    assert first.acquire()
    assert not StreamLock(client, "t", "Node", ttl=10).acquire()


def test_a_handed_over_lock_belongs_to_the_successor_only(client):
    lock = StreamLock(client, "t", "Node", ttl=10)
    assert lock.acquire()
    old = lock.token
    successor = lock.hand_over(10_000)
    assert successor
    assert StreamLock(client, "t", "Node", ttl=10, token=successor).acquire()
    # A redelivered copy of the earlier message carries the old token: it must not run.
    assert not StreamLock(client, "t", "Node", ttl=10, token=old).acquire()


def test_the_heartbeat_reclaims_a_lock_redis_forgot_and_stops_when_another_owner_has_it(client):
    lock = StreamLock(client, "t", "Node", ttl=1.5)
    assert lock.acquire()
    stop = threading.Event()
    with Heartbeat(lock, stop) as heartbeat:
        client.delete(lock.key)  # as after a Redis restart without persistence
        assert stop.wait(0.01) is False
        reclaimed = wait_for("the lock to be reclaimed", lambda: client.get(lock.key), timeout=10)
        assert reclaimed == lock.token.encode()
        client.set(lock.key, "someone-else")
        assert stop.wait(5)
    assert heartbeat.lost.is_set()
