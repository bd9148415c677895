"""/ws/pending/ through the real ASGI stack (origin check, session auth, routing): it says *that* pending
rows changed (after ingest or after the diagnosis task stored results), never *what*."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from claims.consumers import BAD_REQUEST, UNAUTHORIZED, notify_pending_changed
from claims.tasks import recompute_diagnoses
from dashboard.asgi import application
from fleet import ingest
from tests.websockets import ORIGIN, in_memory_channel_layer, run_async, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def in_memory_layer():
    with in_memory_channel_layer():
        yield


@pytest.fixture(name="session_cookie")
def session_cookie_fixture(client, admin_user):
    ingest.get_or_create_cluster("sim")
    return session_cookie(client, admin_user)


async def connect(path, *headers):
    ws = WebsocketCommunicator(application, path, headers=list(headers))
    connected, code = await ws.connect()
    return ws, connected, code


@run_async
async def test_an_anonymous_websocket_is_refused(db):
    _, connected, code = await connect("/ws/pending/", ORIGIN)
    assert not connected and code == UNAUTHORIZED


@run_async
async def test_a_foreign_origin_is_refused_even_with_a_session(session_cookie):
    _, connected, _ = await connect("/ws/pending/", (b"origin", b"http://evil.example"), session_cookie)
    assert not connected


@run_async
async def test_a_bad_filter_is_refused_naming_the_parameter(session_cookie):
    ws, connected, _ = await connect("/ws/pending/?cluster=Not_A_Name", ORIGIN, session_cookie)
    assert connected
    message = await ws.receive_json_from(timeout=5)
    assert message["type"] == "error" and message["parameter"] == "cluster"
    assert (await ws.receive_output(timeout=5))["code"] == BAD_REQUEST


@run_async
async def test_stored_diagnoses_and_claim_changes_are_announced_without_data(session_cookie):
    ws, connected, _ = await connect("/ws/pending/?cluster=sim", ORIGIN, session_cookie)
    assert connected
    assert await ws.receive_json_from(timeout=5) == {"type": "hello", "version": 1}
    # The diagnosis task notifies after storing (transaction.on_commit runs at once outside a transaction).
    before = time.time()
    await sync_to_async(recompute_diagnoses)("sim")
    message = await ws.receive_json_from(timeout=5)
    # When the diagnoses were stored, and nothing else (the page refetches what it may see over HTTP).
    assert before <= message.pop("diagnosed_at") <= time.time()
    assert message == {"type": "changed", "version": 2, "clusters": ["sim"]}
    # An ingest batch of claims, as the watch workers publish it: no diagnosis time.
    await sync_to_async(ingest.publish)({"type": "fleet.change", "cluster": "sim", "kind": "ResourceClaim"})
    assert await ws.receive_json_from(timeout=5) == {"type": "changed", "version": 3, "clusters": ["sim"]}
    await ws.disconnect()


@run_async
async def test_a_change_is_told_at_once_and_changes_within_the_window_after_it_as_one(
    session_cookie, monkeypatch
):
    from claims import consumers

    monkeypatch.setattr(consumers, "DIAGNOSED_SECONDS", 5.0)  # the changes below surely fall inside it
    ws, connected, _ = await connect("/ws/pending/?cluster=sim", ORIGIN, session_cookie)
    assert connected
    await ws.receive_json_from(timeout=5)
    await sync_to_async(notify_pending_changed)("sim")
    # Within 4 s, so not held for the 5-s window: no message came before it.
    assert (await ws.receive_json_from(timeout=4))["version"] == 2
    for _ in range(3):
        await sync_to_async(notify_pending_changed)("sim")
    assert (await ws.receive_json_from(timeout=10))["version"] == 3
    assert await ws.receive_nothing(timeout=1.0)  # the three coalesced
    await ws.disconnect()


@run_async
async def test_a_stored_diagnosis_is_not_held_for_the_window_of_ingest_changes(session_cookie, monkeypatch):
    from claims import consumers

    monkeypatch.setattr(consumers, "BATCH_SECONDS", 8.0)
    monkeypatch.setattr(consumers, "DIAGNOSED_SECONDS", 0.5)
    claims = {"type": "fleet.change", "cluster": "sim", "kind": "ResourceClaim"}
    ws, connected, _ = await connect("/ws/pending/?cluster=sim", ORIGIN, session_cookie)
    assert connected
    await ws.receive_json_from(timeout=5)
    await sync_to_async(ingest.publish)(claims)
    first = await ws.receive_json_from(timeout=5)
    assert first["version"] == 2 and "diagnosed_at" not in first  # told at once: no message before it
    await sync_to_async(ingest.publish)(claims)  # within the 8-s window: held
    assert await ws.receive_nothing(timeout=1.0)
    await sync_to_async(notify_pending_changed)("sim")  # a diagnosis: 0.5 s after the last message
    second = await ws.receive_json_from(timeout=4)
    assert second["version"] == 3 and "diagnosed_at" in second  # well before the 8-s window ends
    assert await ws.receive_nothing(timeout=1.0), "the held ingest change went with it"
    await ws.disconnect()


@run_async
async def test_changes_elsewhere_are_not_announced(session_cookie):
    ws, connected, _ = await connect("/ws/pending/?cluster=sim", ORIGIN, session_cookie)
    assert connected
    await ws.receive_json_from(timeout=5)
    await sync_to_async(notify_pending_changed)("other")
    await sync_to_async(ingest.publish)({"type": "fleet.change", "cluster": "sim", "kind": "ResourceSlice"})
    assert await ws.receive_nothing(timeout=1.5)
    await sync_to_async(notify_pending_changed)("sim")
    assert (await ws.receive_json_from(timeout=5))["clusters"] == ["sim"]
    await ws.disconnect()


@run_async
async def test_logging_out_closes_the_socket(session_cookie, client):
    ws, connected, _ = await connect("/ws/pending/", ORIGIN, session_cookie)
    assert connected
    await ws.receive_json_from(timeout=5)
    await sync_to_async(client.post)("/accounts/logout/")
    assert (await ws.receive_output(timeout=5))["code"] == UNAUTHORIZED
