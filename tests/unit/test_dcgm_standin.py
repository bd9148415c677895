"""The dcgm-exporter stand-in serves dcgm-exporter's metric names and labels for what the simulator holds."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from simulator import dcgm
from simulator import nvidia as nv

AT = datetime(2026, 3, 9, 9, 0, tzinfo=UTC)


def _claim(ns: str, name: str, pool: str, device: str, pod: str) -> dict:
    return {
        "metadata": {"namespace": ns, "name": name},
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": nv.GPU_DRIVER, "pool": pool, "device": device}]
                }
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": "u"}],
        },
    }


def _pod(ns: str, name: str) -> dict:
    return {"metadata": {"namespace": ns, "name": name}, "spec": {"containers": [{"name": "trainer"}]}}


def test_it_labels_an_allocated_gpu_with_its_claim_and_leaves_free_gpus_unlabelled():
    slices = nv.node_slices("node-a", "H100", gpus=2)
    out = dcgm.series(slices, [_claim("ml", "notebook-x", "node-a", "gpu-1", "nb")], [_pod("ml", "nb")], AT)
    active = {s.labels["gpu"]: s for s in out if s.metric == dcgm.ENGINE_ACTIVE}
    held = active["1"].labels
    assert held["dra_claim_name"] == "notebook-x"
    assert held["dra_claim_namespace"] == "ml"
    assert (held["dra_driver_name"], held["dra_pool_name"], held["dra_device_name"]) == (
        nv.GPU_DRIVER,
        "node-a",
        "gpu-1",
    )
    assert (held["pod"], held["namespace"], held["container"]) == ("nb", "ml", "trainer")
    assert held["UUID"] == nv.gpu_uuid("node-a", 1)
    assert held["Hostname"] == "node-a"
    assert held["modelName"] == "NVIDIA H100 80GB HBM3"
    assert "dra_claim_name" not in active["0"].labels
    assert active["1"].value < 0.05  # a notebook idles
    names = {s.metric for s in out}
    assert names == {dcgm.ENGINE_ACTIVE, dcgm.GPU_UTIL, dcgm.FB_USED, dcgm.FB_FREE, dcgm.POWER}


def test_static_mig_instances_carry_instance_labels_and_the_nvml_mig_uuid():
    slices = nv.node_slices("node-m", "H100", mode="static-mig", layout="all-1g", gpus=1)
    mig = next(d for s in slices for d in s["spec"]["devices"])
    out = dcgm.series(
        slices, [_claim("inf", "chat-0", "node-m", mig["name"], "chat")], [_pod("inf", "chat")], AT
    )
    active = [s for s in out if s.metric == dcgm.ENGINE_ACTIVE]
    assert len(active) == 7  # one per MIG instance, none for the GPU itself
    held = [s.labels for s in active if "dra_claim_name" in s.labels]
    assert len(held) == 1
    assert held[0]["GPU_I_PROFILE"] == "1g.10gb"
    assert held[0]["dra_mig_device_uuid"] == mig["attributes"]["uuid"]["string"].replace("mig-", "MIG-")
    assert held[0]["UUID"] == nv.gpu_uuid("node-m", 0)  # the parent GPU's
    assert not [s for s in out if s.metric == dcgm.GPU_UTIL]  # NVML reports no GPU_UTIL in MIG mode


def test_dynamic_mig_instances_have_no_dra_labels():
    slices = nv.node_slices("node-d", "H100", mode="dynamic-mig", gpus=1)
    mig = next(d for s in slices for d in s["spec"].get("devices") or [] if "-mig-1g10gb-" in d["name"])
    out = dcgm.series(slices, [_claim("inf", "chat-1", "node-d", mig["name"], "c")], [_pod("inf", "c")], AT)
    active = [s.labels for s in out if s.metric == dcgm.ENGINE_ACTIVE]
    assert len(active) == 1
    assert active[0]["GPU_I_PROFILE"] == "1g.10gb"
    assert not [k for k in active[0] if k.startswith("dra_")]


def test_the_exporter_serves_the_exposition_format():
    slices = nv.node_slices("node-a", "B200", gpus=1)
    exporter = dcgm.DcgmExporter(lambda: dcgm.series(slices, [], [], AT))
    exporter.start()
    try:
        body = urllib.request.urlopen(exporter.url, timeout=5).read().decode()
    finally:
        exporter.stop()
    families = {f.name: f for f in text_string_to_metric_families(body)}
    assert families[dcgm.ENGINE_ACTIVE].type == "gauge"
    assert families[dcgm.FB_FREE].samples[0].value == nv.MODELS["B200"].memory_bytes // 2**20
