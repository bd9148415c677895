"""Publishes a simulated NVIDIA GPU fleet into the test control plane.

The object shapes come from ``simulator.nvidia`` (the same generator the demo uses), so a
test exercises exactly what the dashboard will ingest; this module only creates the objects and
the kubelet-less Nodes they refer to.
"""

from __future__ import annotations

from simulator import nvidia
from tests.controlplane.kube import ApiError, Kube, Obj
from tests.controlplane.nodes import for_create, register_node


class FleetPublisher:
    """Creates DeviceClasses, Nodes and per-node ResourceSlices like the NVIDIA driver would."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def device_classes(self) -> list[Obj]:
        """Creates (or replaces the spec of) the NVIDIA DeviceClasses."""
        stored = []
        for cls in nvidia.device_classes():
            try:
                stored.append(self.kube.create(for_create(cls)))
            except ApiError as err:
                if err.code != 409:
                    raise
                stored.append(self.kube.patch("DeviceClass", cls["metadata"]["name"], {"spec": cls["spec"]}))
        return stored

    def gpu_node(
        self,
        name: str,
        model: str,
        *,
        mode: str = "full",
        layout: str | None = None,
        gpus: int = 8,
        clique: str | None = None,
        labels: dict[str, str] | None = None,
        compute_domain: bool = False,
    ) -> list[Obj]:
        """Registers a Ready GPU node and publishes its slices; returns the stored slices."""
        node = register_node(
            self.kube, nvidia.node_object(name, model, clique=clique, labels=labels, gpus=gpus)
        )
        slices = nvidia.node_slices(name, model, mode=mode, layout=layout, gpus=gpus)
        if compute_domain:
            slices.append(nvidia.compute_domain_slice(name))
        return [self.publish_slice(s, node) for s in slices]

    def publish_slice(self, resource_slice: Obj, node: Obj) -> Obj:
        """Creates a slice owned by ``node`` as the kubelet plugin helper does.

        The owner reference must carry the real Node uid: with the simulator's synthetic uid the
        garbage collector would find the owner "gone" and delete the slice.
        """
        body = for_create(resource_slice)
        body["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": node["metadata"]["name"],
                "uid": node["metadata"]["uid"],
                "controller": True,
            }
        ]
        return self.kube.create(body)
