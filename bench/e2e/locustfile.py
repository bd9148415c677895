"""20 users on the pages and the REST API of a running claimscope (``bench_e2e.py`` runs it headless).

Every user is logged in with the session cookie in ``CLAIMSCOPE_BENCH_SESSION`` (made by the orchestrator
for its benchmark user) and picks pages and API calls a fleet operator uses, weighted toward the overview.
"""

from __future__ import annotations

import os
import random

from locust import HttpUser, between, task

NODES = [f"b200-{i:04d}" for i in range(0, 1800, 37)] + [f"h100-mig-{i:04d}" for i in range(0, 500, 23)]
if os.environ.get("CLAIMSCOPE_BENCH_NODES"):  # bench_e2e.py --source controlplane: its own node names
    NODES = os.environ["CLAIMSCOPE_BENCH_NODES"].split(",")


class Operator(HttpUser):
    wait_time = between(0.5, 2.0)

    def on_start(self) -> None:
        self.client.cookies.set("sessionid", os.environ["CLAIMSCOPE_BENCH_SESSION"])

    @task(4)
    def overview(self) -> None:
        self.client.get("/fleet/", name="page /fleet/")

    @task(2)
    def heatmap_page(self) -> None:
        self.client.get("/fleet/heatmap/", name="page /fleet/heatmap/")

    @task(2)
    def heatmap_json(self) -> None:
        self.client.get("/fleet/heatmap.json", name="/fleet/heatmap.json")

    @task(2)
    def pending_page(self) -> None:
        self.client.get("/claims/pending/", name="page /claims/pending/")

    @task(2)
    def node_page(self) -> None:
        self.client.get(f"/fleet/c/sim/nodes/{random.choice(NODES)}/", name="page /fleet/c/sim/nodes/<node>/")

    @task(3)
    def summary(self) -> None:
        self.client.get("/api/v1/summary/", name="api summary/")

    @task(2)
    def devices(self) -> None:
        self.client.get("/api/v1/devices/?page_size=500", name="api devices/?page_size=500")

    @task(2)
    def claims(self) -> None:
        self.client.get("/api/v1/claims/?page_size=500", name="api claims/?page_size=500")

    @task(2)
    def pending(self) -> None:
        self.client.get("/api/v1/pending/?page_size=100", name="api pending/?page_size=100")

    @task(1)
    def nodes(self) -> None:
        self.client.get("/api/v1/nodes/?page_size=500", name="api nodes/?page_size=500")
