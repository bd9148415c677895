"""A user granted one namespace never sees another namespace's claims, pods or events: not in any page, API
list (JSON or CSV), the heatmap JSON, nor the websocket feed; and does see their own namespace's.

To cover a new page, add its path to ``SEEDS`` (or link it from a crawled page); a new API list endpoint
registered on the router is covered by itself.
"""

from __future__ import annotations

from collections import deque
from html.parser import HTMLParser
from typing import Any
from urllib.parse import urljoin, urlsplit

import orjson
import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.urls import Resolver404, resolve

from dashboard.api_urls import router
from fleet.access.visibility import HIDDEN_LABEL, Visibility, visibility_for
from fleet.models import Device, DeviceAllocation, Node, Pod, ResourceClaim, SchedulingEvent
from tests.fleet_pages.conftest import FleetEditor
from tests.security.conftest import CLUSTER, GRANTED, Names
from tests.websockets import ORIGIN, in_memory_channel_layer, session_cookie

# Pages the crawl starts from, besides the links it finds (the nav bar on every page included).
SEEDS = (
    "/",
    "/fleet/",
    "/fleet/heatmap/",
    "/fleet/mig/",
    f"/fleet/c/{CLUSTER}/",
    "/claims/pending/",
    "/claims/pending/fragment/",  # what the pending page fetches when its websocket says "changed"
    "/claims/triage/",
    "/api/docs/",
    "/api/tokens/",
)
SKIP_PREFIXES = ("/accounts/logout/", "/admin/", "/static/", "/api/schema/")
MAX_PAGES = 1500


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value and name in (
                "href",
                "src",
                "action",
                "data-href",
                "data-url",
                "data-card",
                "data-fragment",
            ):
                self.links.append(value)


def _routable(path: str) -> bool:
    try:
        resolve(urlsplit(path).path)
    except Resolver404:
        return False
    return True


def crawl(client: Client, seeds: list[str]) -> dict[str, str]:
    """Every same-site page reachable from ``seeds`` (GET, HTML or JSON), by path: its body."""
    seen: set[str] = set()
    queue = deque(seeds)
    pages: dict[str, str] = {}
    while queue and len(pages) < MAX_PAGES:
        url = queue.popleft()
        if url in seen:
            continue
        seen.add(url)
        response = client.get(url)
        assert response.status_code in (200, 400, 404), f"{url}: {response.status_code}"
        body = response.content.decode()
        pages[url] = body
        if response.status_code != 200 or "html" not in response.get("Content-Type", ""):
            continue
        parser = _Links()
        parser.feed(body)
        for link in parser.links:
            parts = urlsplit(urljoin(url, link))
            if parts.netloc not in ("", "testserver") or not parts.path.startswith("/"):
                continue
            target = parts.path + (f"?{parts.query}" if parts.query else "")
            if not parts.path.startswith(SKIP_PREFIXES) and target not in seen:
                queue.append(target)
    return pages


def _detail_pages() -> list[str]:
    """Every node, GPU, GPU hover card and device page of the fixture fleet (links or not)."""
    out = [f"/fleet/c/{CLUSTER}/nodes/{n}/" for n in Node.objects.values_list("name", flat=True)]
    for node, index in (
        Device.objects.filter(kind__in=("gpu", "mig"))
        .exclude(gpu_minor=None)
        .values_list("node_name", "gpu_minor")
        .distinct()
    ):
        out += [
            f"/fleet/c/{CLUSTER}/nodes/{node}/gpus/{index}/",
            f"/fleet/c/{CLUSTER}/nodes/{node}/gpus/{index}/card/",
        ]
    for driver, pool, name in Device.objects.values_list("driver", "pool", "name"):
        out.append(f"/fleet/c/{CLUSTER}/device/?driver={driver}&pool={pool}&name={name}")
    return out


def test_visibility_follows_grants_permission_and_superuser(viewer, django_user_model) -> None:
    vis = visibility_for(viewer)
    assert vis == Visibility(False, frozenset({(CLUSTER, GRANTED)}))
    assert vis.allows(CLUSTER, GRANTED) and not vis.allows(CLUSTER, "ml-train")
    assert not vis.allows("other-cluster", GRANTED)
    assert set(ResourceClaim.objects.filter(vis.q()).values_list("namespace", flat=True)) == {GRANTED}
    nobody = django_user_model.objects.create_user("nobody", password="x")
    assert ResourceClaim.objects.filter(visibility_for(nobody).q()).count() == 0
    root = django_user_model.objects.create_superuser("root", password="x")
    assert visibility_for(root).all_namespaces


def test_no_page_shows_another_namespaces_claims_pods_or_events(viewer_client, names: Names) -> None:
    seeds = [s for s in SEEDS if _routable(s)] + _detail_pages()
    pages = crawl(viewer_client, seeds)
    leaks = {url: found for url, body in pages.items() if (found := names.leaks(body))}
    assert not leaks, f"foreign names shown: {leaks}"
    everything = "\n".join(pages.values())
    # The viewer's own claims are named (so this test can fail), and foreign holdings show as held.
    assert names.shown(everything, names.visible_claims) == sorted(names.visible_claims)
    assert HIDDEN_LABEL in everything
    assert len(pages) > 60 and any(u.startswith(f"/fleet/c/{CLUSTER}/claims/{GRANTED}/") for u in pages)


def test_a_foreign_claim_page_and_diagnosis_answer_404(viewer_client) -> None:
    foreign = ResourceClaim.objects.exclude(namespace=GRANTED).order_by("name")
    assert foreign.exists()
    for claim in foreign:
        for url in (
            f"/fleet/c/{CLUSTER}/claims/{claim.namespace}/{claim.name}/",
            f"/api/v1/claims/{claim.pk}/",
            f"/api/v1/claims/{claim.pk}/diagnosis",
            f"/claims/c/{CLUSTER}/{claim.namespace}/{claim.name}/diagnosis/",
        ):
            if _routable(url):
                assert viewer_client.get(url).status_code == 404, url
    for model, prefix in ((Pod, "pods"), (SchedulingEvent, "events")):
        for pk in model.objects.exclude(namespace=GRANTED).values_list("pk", flat=True):
            assert viewer_client.get(f"/api/v1/{prefix}/{pk}/").status_code == 404
    own = ResourceClaim.objects.filter(namespace=GRANTED).first()
    assert own is not None
    assert viewer_client.get(f"/fleet/c/{CLUSTER}/claims/{GRANTED}/{own.name}/").status_code == 200
    assert viewer_client.get(f"/api/v1/claims/{own.pk}/diagnosis").status_code == 200


def _api_urls(fmt: str) -> list[str]:
    """Every list endpoint on the router (new ones are covered by themselves), then the JSON-only ones."""
    lists = [f"/api/v1/{prefix}/?page_size=10000" for prefix, _, _ in router.registry]
    lists.append("/api/v1/leaks/?page_size=10000&older_than=0")
    if fmt == "csv":
        return [f"{url}&format=csv" for url in lists]
    json_only = ["/api/v1/heatmap/", "/api/v1/summary/", "/api/v1/triage/", "/fleet/heatmap.json"]
    return [*lists, *(url for url in json_only if _routable(url))]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_no_api_list_shows_another_namespaces_claims_pods_or_events(viewer_client, names: Names, fmt) -> None:
    bodies = {}
    for url in _api_urls(fmt):
        response = viewer_client.get(url)
        assert response.status_code == 200, (url, response.content[:300])
        bodies[url.split("?")[0]] = response.content.decode()
    leaks = {url: found for url, body in bodies.items() if (found := names.leaks(body))}
    assert not leaks, f"foreign names in the API ({fmt}): {leaks}"
    assert names.shown(bodies["/api/v1/claims/"], names.visible_claims) == sorted(names.visible_claims)
    assert names.shown(bodies["/api/v1/pods/"], names.visible_pods) == sorted(names.visible_pods)
    assert names.shown(bodies["/api/v1/pending/"], names.visible_claims)
    assert names.shown(bodies["/api/v1/devices/"], names.visible_claims)


def test_a_diagnosis_names_only_visible_holders(viewer_client, names: Names) -> None:
    pending = ResourceClaim.objects.filter(namespace=GRANTED, state="pending")
    bodies = [viewer_client.get(f"/api/v1/claims/{c.pk}/diagnosis").content.decode() for c in pending]
    assert bodies and all('"category"' in b for b in bodies)
    assert not [names.leaks(b) for b in bodies if names.leaks(b)]


def test_an_unrestricted_user_sees_the_foreign_names_the_viewer_does_not(
    client, fleet, diagnosed, names, django_user_model
) -> None:
    # The same requests as above, for a superuser: proves the leak checks look where the names would be.
    client.force_login(django_user_model.objects.create_superuser("root", password="x"))
    body = client.get("/api/v1/claims/?page_size=10000").content.decode()
    assert len(names.leaks(body)) > 10
    pages = crawl(
        client, [f"/fleet/c/{CLUSTER}/nodes/{n}/" for n in Node.objects.values_list("name", flat=True)]
    )
    assert names.leaks("\n".join(pages.values()))


# ------------------------------------------------------------------------------------------ websocket


@pytest.fixture
def in_memory_layer():
    with in_memory_channel_layer():
        yield


@pytest.mark.django_db(transaction=True)
def test_the_websocket_snapshot_and_deltas_show_no_foreign_names(
    in_memory_layer, client, viewer, names
) -> None:
    from dashboard.asgi import application

    cookie = session_cookie(client, viewer)

    async def scenario() -> list[dict[str, Any]]:
        ws = WebsocketCommunicator(application, "/ws/fleet/", headers=[ORIGIN, cookie])
        connected, _ = await ws.connect()
        assert connected
        messages = [await ws.receive_json_from(timeout=10)]

        def change_a_foreign_claim() -> None:
            editor = FleetEditor(CLUSTER)
            foreign = [c for c in editor.allocated_claims() if c["metadata"]["namespace"] != GRANTED]
            editor.deallocate(foreign[0])

        await database_sync_to_async(change_a_foreign_claim)()
        messages.append(await ws.receive_json_from(timeout=10))
        await ws.disconnect()
        return messages

    snapshot, delta = async_to_sync(scenario)()
    assert snapshot["type"] == "snapshot" and snapshot["rows"]
    assert delta["type"] == "delta" and delta["rows"]
    for message in (snapshot, delta):
        assert not names.leaks(orjson.dumps(message).decode())


def test_counts_stay_the_same_for_a_restricted_user(viewer_client, client, django_user_model) -> None:
    root = Client()
    root.force_login(django_user_model.objects.create_superuser("root", password="x"))
    for url in ("/fleet/heatmap.json", "/api/v1/summary/", "/api/v1/gpus/?page_size=10000"):
        assert viewer_client.get(url).content == root.get(url).content, url
    # Every GPU card lists one line per claim holding the GPU, foreign claims as "another namespace".
    holding: dict[tuple[str, int | None], set[str]] = {}
    for d in Device.objects.filter(kind__in=("gpu", "mig")).exclude(gpu_minor=None):
        held = DeviceAllocation.objects.filter(
            pool=d.pool, device_name=d.name, driver=d.driver, admin_access=False
        ).values_list("claim_uid", flat=True)
        holding.setdefault((d.node_name, d.gpu_minor), set()).update(held)
    assert any(len(uids) > 1 for uids in holding.values())
    for (node, index), uids in holding.items():
        card = viewer_client.get(f"/fleet/c/{CLUSTER}/nodes/{node}/gpus/{index}/card/").content.decode()
        claims_cell = card.split('class="claims">', 1)[1].split("</dd>", 1)[0]
        lines = claims_cell.count(HIDDEN_LABEL) + claims_cell.count("<a ")
        assert lines == len(uids), (node, index, claims_cell)


def test_what_if_names_only_visible_holders(viewer_client, client, names: Names, django_user_model) -> None:
    # A claim like research's pending B200 claim: the devices it wants are held by other namespaces.
    raw = ResourceClaim.objects.get(namespace=GRANTED, name__startswith="finetune-70b").raw
    body = orjson.dumps({k: raw[k] for k in ("apiVersion", "kind", "metadata", "spec")})
    answer = viewer_client.post("/api/v1/whatif", data=body, content_type="application/json")
    assert answer.status_code == 200 and '"category"' in answer.content.decode()
    assert not names.leaks(answer.content.decode())
    client.force_login(django_user_model.objects.create_superuser("root", password="x"))
    unrestricted = client.post("/api/v1/whatif", data=body, content_type="application/json").content.decode()
    assert names.leaks(unrestricted)  # the holders are named to someone who may see them
