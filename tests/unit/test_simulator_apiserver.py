"""The simulator speaks the Kubernetes list/watch HTTP protocol."""

import json
import threading
from typing import Any

import pytest
import urllib3

from simulator import nvidia
from simulator.apiserver import SimulatorAPIServer
from simulator.cluster import SimulatedCluster

TOKEN = "t0ken-for-tests"


@pytest.fixture
def server():
    cluster = SimulatedCluster(history_limit=20)
    for i in range(7):
        cluster.create(nvidia.node_object(f"node-{i}", "B200"))
    srv = SimulatorAPIServer(cluster, TOKEN)
    srv.serve_in_thread()
    yield srv
    srv.stop()


def get(server, path, token=TOKEN, **kw):
    http = urllib3.PoolManager()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return http.request("GET", server.url + path, headers=headers, **kw)


def test_lists_are_paged_with_continue_tokens_at_one_version(server):
    first = json.loads(get(server, "/api/v1/nodes?limit=3").data)
    assert first["kind"] == "NodeList"
    assert [n["metadata"]["name"] for n in first["items"]] == ["node-0", "node-1", "node-2"]
    rv = first["metadata"]["resourceVersion"]
    server.cluster.create(nvidia.node_object("node-late", "B200"))  # not in this list's pages
    names, token = [], first["metadata"]["continue"]
    while token:
        page = json.loads(get(server, f"/api/v1/nodes?limit=3&continue={token}").data)
        assert page["metadata"]["resourceVersion"] == rv
        names += [n["metadata"]["name"] for n in page["items"]]
        token = page["metadata"].get("continue")
    assert names == [f"node-{i}" for i in range(3, 7)]


def test_watch_streams_events_and_bookmarks_as_json_lines(server):
    rv = json.loads(get(server, "/api/v1/nodes").data)["metadata"]["resourceVersion"]
    threading.Timer(0.2, lambda: server.cluster.delete("Node", None, "node-3")).start()
    response = get(
        server,
        f"/api/v1/nodes?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=1",
        preload_content=False,
    )
    assert response.headers["Transfer-Encoding"] == "chunked"
    events = [json.loads(line) for line in response.stream() for line in line.splitlines() if line]
    assert [e["type"] for e in events] == ["DELETED", "BOOKMARK"]
    assert events[0]["object"]["metadata"]["name"] == "node-3"


def test_a_compacted_version_gets_410_inside_the_stream(server):
    for i in range(30):
        server.cluster.create(nvidia.node_object(f"churn-{i}", "H100"))
    response = get(server, "/api/v1/nodes?watch=1&resourceVersion=1001&timeoutSeconds=1")
    (event,) = [json.loads(line) for line in response.data.splitlines() if line]
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410


def test_it_refuses_a_wrong_token_and_unknown_paths(server):
    assert get(server, "/api/v1/nodes", token="nope").status == 401
    missing = get(server, "/api/v1/secrets")
    assert missing.status == 404
    assert json.loads(missing.data)["kind"] == "Status"
    assert get(server, "/api/v1/nodes?limit=x").status == 400


def test_it_writes_a_kubeconfig_the_kubernetes_client_accepts(server, tmp_path):
    from kubernetes import client, config

    path = server.write_kubeconfig(tmp_path / "kubeconfig")
    api = config.new_client_from_config(str(path))
    # Raw JSON: the client's typed models reject our nodes' partial nodeInfo (no kubelet fills it).
    nodes: Any = client.CoreV1Api(api).list_node(_preload_content=False)
    assert len(json.loads(nodes.data)["items"]) == 7


@pytest.fixture
def bookmarking():
    """A server with one node whose watches bookmark every 0.1 s (the default is every 15 s)."""
    cluster = SimulatedCluster()
    cluster.create(nvidia.node_object("node-0", "B200"))
    srv = SimulatorAPIServer(cluster, TOKEN, bookmark_seconds=0.1)
    srv.serve_in_thread()
    yield srv
    srv.stop()


def watch_events(server, query):
    response = get(server, f"/api/v1/nodes?watch=true&timeoutSeconds=1&{query}", preload_content=False)
    return [json.loads(line) for chunk in response.stream() for line in chunk.splitlines() if line]


def test_a_quiet_watch_gets_periodic_bookmarks_carrying_only_the_version(bookmarking):
    rv = bookmarking.cluster.resource_version
    events = watch_events(bookmarking, f"resourceVersion={rv}&allowWatchBookmarks=true")
    *periodic, last = events
    assert len(periodic) >= 2  # 1 s of silence, a bookmark every 0.1 s
    assert {e["type"] for e in events} == {"BOOKMARK"}
    # The API server's format: an empty object of the kind with only its resourceVersion.
    assert all(
        e["object"] == {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}
        for e in periodic
    )
    assert last["object"]["metadata"]["resourceVersion"] == rv


def test_bookmarks_carry_the_version_other_kinds_moved_the_cluster_to(bookmarking):
    rv = bookmarking.cluster.resource_version
    device_class = {"kind": "DeviceClass", "apiVersion": "resource.k8s.io/v1", "metadata": {"name": "gpu"}}
    threading.Timer(0.3, lambda: bookmarking.cluster.create(device_class)).start()
    events = watch_events(bookmarking, f"resourceVersion={rv}&allowWatchBookmarks=true")
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions[0] == int(rv) and versions[-1] == int(rv) + 1  # the node watch's cursor moves on
    assert versions == sorted(versions)


def test_a_watch_without_allow_watch_bookmarks_gets_none(bookmarking):
    rv = bookmarking.cluster.resource_version
    assert watch_events(bookmarking, f"resourceVersion={rv}") == []


def test_a_bad_bookmark_interval_is_refused():
    with pytest.raises(ValueError, match="bookmark_seconds"):
        SimulatorAPIServer(SimulatedCluster(), TOKEN, bookmark_seconds=0)
    with pytest.raises(ValueError, match="bookmark_interval"):
        next(SimulatedCluster().watch("Node", "", timeout_seconds=1, bookmark_interval=-1))
