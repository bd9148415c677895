"""/ws/fleet/ through the real ASGI stack (origin check, session auth, routing) with WebsocketCommunicator."""

from __future__ import annotations

import threading

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.db import connection

from dashboard.asgi import application
from fleet import feed
from fleet.consumers import BAD_REQUEST, FEED_EXECUTOR, FEED_THREADS, UNAUTHORIZED
from tests.fleet_pages.conftest import FIXTURE_GPUS, FleetEditor
from tests.websockets import ORIGIN, in_memory_channel_layer, run_async, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def in_memory_layer():
    with in_memory_channel_layer():
        yield


@pytest.fixture(name="session_cookie")
def session_cookie_fixture(client, user, fleet):
    return session_cookie(client, user)


def cells(rows):
    return sum(len(row[4]) for row in rows.values())


@pytest.mark.parametrize("path", ["/ws/nonexistent/", "/ws/fleet/extra/", "/"])
@run_async
async def test_an_unknown_websocket_path_is_refused_at_the_handshake(path, session_cookie, caplog):
    ws = WebsocketCommunicator(application, path, headers=[ORIGIN, session_cookie])
    connected, _ = await ws.connect()
    assert not connected
    assert f"no route for {path}" in caplog.text and "Traceback" not in caplog.text


@run_async
async def test_an_anonymous_websocket_is_refused(fleet):
    ws = WebsocketCommunicator(application, "/ws/fleet/", headers=[ORIGIN])
    connected, code = await ws.connect()
    assert not connected and code == UNAUTHORIZED


@run_async
async def test_a_foreign_origin_is_refused_even_with_a_session(session_cookie):
    ws = WebsocketCommunicator(
        application, "/ws/fleet/", headers=[(b"origin", b"http://evil.example"), session_cookie]
    )
    connected, _ = await ws.connect()
    assert not connected


@run_async
async def test_a_logged_in_client_gets_a_snapshot_then_a_delta_after_an_ingest_batch(session_cookie):
    ws = WebsocketCommunicator(application, "/ws/fleet/", headers=[ORIGIN, session_cookie])
    connected, _ = await ws.connect()
    assert connected
    snapshot = await ws.receive_json_from(timeout=10)
    assert snapshot["type"] == "snapshot" and snapshot["version"] == 1
    assert cells(snapshot["rows"]) == FIXTURE_GPUS

    def deallocate_one():
        editor = FleetEditor()
        editor.deallocate(editor.allocated_claims()[0])

    await database_sync_to_async(deallocate_one)()  # publishes after commit
    delta = await ws.receive_json_from(timeout=10)
    assert delta["type"] == "delta" and delta["version"] == 2 and delta["rows"]
    await ws.disconnect()


@run_async
async def test_feed_messages_are_built_on_the_feeds_own_few_threads(session_cookie, monkeypatch):
    # Not the shared sync thread (a slow page would delay deltas), nor the default executor (a database
    # connection for each of its threads): the feed's bounded pool.
    threads: list[str] = []
    for name in ("snapshot", "delta"):
        original = getattr(feed.FleetFeed, name)

        def spy(self, _original=original):
            threads.append(threading.current_thread().name)
            return _original(self)

        monkeypatch.setattr(feed.FleetFeed, name, spy)
    sockets = [WebsocketCommunicator(application, "/ws/fleet/", headers=[ORIGIN, session_cookie])]
    sockets.append(WebsocketCommunicator(application, "/ws/fleet/", headers=[ORIGIN, session_cookie]))
    for ws in sockets:
        assert (await ws.connect())[0]
        assert (await ws.receive_json_from(timeout=10))["type"] == "snapshot"

    def deallocate_one():
        editor = FleetEditor()
        editor.deallocate(editor.allocated_claims()[0])

    await database_sync_to_async(deallocate_one)()
    for ws in sockets:
        assert (await ws.receive_json_from(timeout=10))["type"] == "delta"
        await ws.disconnect()
    assert len(threads) == 4 and all(t.startswith("fleet-feed") for t in threads), threads
    assert FEED_EXECUTOR._max_workers == FEED_THREADS == 2


@pytest.mark.postgresql
def test_a_feed_connection_the_server_dropped_is_replaced(session_cookie):
    @run_async
    async def snapshot() -> str:
        ws = WebsocketCommunicator(application, "/ws/fleet/", headers=[ORIGIN, session_cookie])
        assert (await ws.connect())[0]
        message = await ws.receive_json_from(timeout=10)
        await ws.disconnect()
        return message["type"]

    assert snapshot() == "snapshot"  # the feed's threads now hold persistent connections
    with connection.cursor() as cur:  # a restarted server, a failover: every other backend ends
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    assert snapshot() == "snapshot"
    assert snapshot() == "snapshot"


@run_async
async def test_a_change_goes_out_at_once_and_batches_within_the_window_after_it_as_one_delta(
    session_cookie, monkeypatch
):
    # A window long enough that the first delta and the three batches below surely fall inside it.
    monkeypatch.setattr(feed, "BATCH_SECONDS", 15.0)
    ws = WebsocketCommunicator(application, "/ws/fleet/", headers=[ORIGIN, session_cookie])
    await ws.connect()
    await ws.receive_json_from(timeout=10)

    def batches(start, stop):
        editor = FleetEditor()
        for claim in editor.allocated_claims()[start:stop]:
            editor.deallocate(claim)

    await database_sync_to_async(batches)(0, 1)
    # Within 10 s, so not held for the 15-s window: no delta came before it.
    first = await ws.receive_json_from(timeout=10)
    assert first["version"] == 2
    await database_sync_to_async(batches)(1, 4)
    second = await ws.receive_json_from(timeout=20)
    assert second["version"] == 3
    assert await ws.receive_nothing(timeout=1.0)  # the three events coalesced
    await ws.disconnect()


@run_async
async def test_a_client_that_saw_a_gap_gets_a_new_snapshot_on_request(session_cookie):
    ws = WebsocketCommunicator(application, "/ws/fleet/?model=H100", headers=[ORIGIN, session_cookie])
    await ws.connect()
    first = await ws.receive_json_from(timeout=10)
    await ws.send_json_to({"type": "resync"})
    again = await ws.receive_json_from(timeout=10)
    assert again["type"] == "snapshot" and again["version"] == first["version"] + 1
    assert again["rows"] == first["rows"] and {r[2] for r in again["rows"].values()} == {"H100"}
    await ws.disconnect()


@run_async
async def test_a_bad_filter_is_answered_with_an_error_naming_the_parameter(session_cookie):
    ws = WebsocketCommunicator(application, "/ws/fleet/?state=broken", headers=[ORIGIN, session_cookie])
    connected, _ = await ws.connect()
    assert connected
    error = await ws.receive_json_from(timeout=10)
    assert error["type"] == "error" and error["parameter"] == "state"
    assert (await ws.receive_output(timeout=5))["code"] == BAD_REQUEST


@run_async
async def test_changes_reach_the_group_only_after_commit(session_cookie):
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(settings.CLAIMSCOPE_INGEST_GROUP, channel)

    def batch_in_rolled_back_transaction():
        from django.db import transaction

        class Rollback(Exception):
            pass

        editor = FleetEditor()
        try:
            with transaction.atomic():
                editor.deallocate(editor.allocated_claims()[0])
                raise Rollback
        except Rollback:
            pass

    await database_sync_to_async(batch_in_rolled_back_transaction)()

    def committed_batch():
        editor = FleetEditor()
        claim = editor.allocated_claims()[1]
        editor.deallocate(claim)
        return f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"

    written = await database_sync_to_async(committed_batch)()
    event = await layer.receive(channel)  # the first event is the committed batch's: nothing came before
    assert event["type"] == "fleet.change" and event["written"] == [written]


@run_async
async def test_after_the_last_client_leaves_pages_still_see_every_change(session_cookie):
    """A connected consumer tells the shared GPU cache what changed; once it is gone nobody does, so the
    cache must check every pool again (a page rendered by the same process must not go stale)."""
    from fleet import feed
    from fleet.filters import FleetFilter

    ws = WebsocketCommunicator(application, "/ws/fleet/", headers=[ORIGIN, session_cookie])
    await ws.connect()
    await ws.receive_json_from(timeout=10)
    await ws.disconnect()

    def change_then_render():
        editor = FleetEditor()
        editor.deallocate(editor.allocated_claims()[0])  # its event reaches no consumer
        return feed.load_rows(FleetFilter()), feed.rows_from_devices(FleetFilter())

    rows, truth = await database_sync_to_async(change_then_render)()
    assert rows == truth


@run_async
async def test_a_delta_the_database_could_not_answer_logs_one_line_and_the_next_change_delivers(
    session_cookie, monkeypatch, caplog
):
    """While PostgreSQL restarts, a delta fails with a database error: one warning without a traceback,
    and the clusters stay dirty, so the next change delivers them."""
    from django.db import OperationalError

    ws = WebsocketCommunicator(application, "/ws/fleet/", headers=[ORIGIN, session_cookie])
    connected, _ = await ws.connect()
    assert connected
    await ws.receive_json_from(timeout=10)
    real_delta = feed.FleetFeed.delta
    failures: list[int] = []

    def delta_once_unanswered(self, *args, **kwargs):
        if not failures:
            failures.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        return real_delta(self, *args, **kwargs)

    monkeypatch.setattr(feed.FleetFeed, "delta", delta_once_unanswered)

    def deallocate(index):
        editor = FleetEditor()
        editor.deallocate(editor.allocated_claims()[index])

    await database_sync_to_async(deallocate)(0)
    assert await ws.receive_nothing(timeout=feed.BATCH_SECONDS + 1.5)
    assert "delta postponed, no answer from the database" in caplog.text
    assert "Traceback" not in caplog.text and "delta failed" not in caplog.text
    await database_sync_to_async(deallocate)(1)  # each editor starts from the fixture: another claim
    delta = await ws.receive_json_from(timeout=10)
    assert delta["type"] == "delta" and delta["rows"]
    await ws.disconnect()
