"""Persistent database connections survive the server dropping them (restart, failover, idle timeout)."""

import pytest
from django.db import close_old_connections, connection

from fleet.models import Cluster

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_connection_the_server_dropped_is_replaced_at_the_next_request():
    assert connection.settings_dict["CONN_MAX_AGE"] > 0  # persistent: the case this is about
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        (pid,) = cur.fetchone()
    # Another session ends ours, as a restarted or failed-over server would.
    other = connection.copy()
    try:
        with other.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    close_old_connections()  # a new request (or feed build) begins
    assert Cluster.objects.count() == 0  # not "terminating connection due to administrator command"
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        assert cur.fetchone()[0] != pid
