"""Ingest's side effects (change events, listeners) log a Redis outage once, not per batch."""

from __future__ import annotations

import logging

import pytest
from kombu.exceptions import OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError

from fleet import outage_log


@pytest.fixture(autouse=True)
def _fresh_outage_log():
    outage_log._outage_logged.clear()
    yield
    outage_log._outage_logged.clear()


def test_a_redis_outage_logs_one_line_per_side_effect_without_a_traceback(caplog):
    log = logging.getLogger("test.outage")
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        for _ in range(300):  # one per batch during an outage
            outage_log.log_failure(
                log, "could not publish change events for prod Pod", RedisConnectionError("x")
            )
        outage_log.log_failure(log, "could not count a fleet commit", RedisConnectionError("x"))
        outage_log.log_failure(log, "change listener failed", OperationalError("broker down"))
    assert [(r.levelname, r.exc_info) for r in caplog.records] == [("WARNING", None)] * 3
    assert "prod Pod: Redis unreachable (ConnectionError: x)" in caplog.records[0].getMessage()


def test_any_other_failure_is_logged_every_time_with_its_traceback(caplog):
    log = logging.getLogger("test.outage")
    with caplog.at_level(logging.WARNING, logger="test.outage"):
        for _ in range(2):
            outage_log.log_failure(log, "change listener failed", ValueError("bug"))
    assert [r.levelname for r in caplog.records] == ["ERROR", "ERROR"]
    assert all(r.exc_info and r.exc_info[0] is ValueError for r in caplog.records)
