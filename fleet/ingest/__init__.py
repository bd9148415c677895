"""The only writer of the fleet and claim tables (and of the per-GPU read model derived from them).

A batch of records (upserts and deletes) is applied in one transaction with a constant number of bulk
statements per table, whatever the batch size. A record older than the stored resourceVersion is ignored
(the fence is in the SQL, so two racing writers cannot regress a row). After commit one change event per
batch goes to the channel layer group.

Kinds are described by :class:`TableSpec` s registered per kind: the cluster-scoped ones in
:mod:`fleet.ingest.fleet_kinds`, claims, templates, pods and events in :mod:`fleet.ingest.namespaced_kinds`
(where the analysis hooks its claim history in, :func:`set_claim_hooks`).

Modules: ``specs`` (the kind registry), ``apply`` (batches and relists), ``rows`` (records and their child
rows through the fence), ``sql`` (the general SQL writer), ``locks`` (stream and read-model locks),
``cursors`` (the watch cursors: positions, states, leases), ``pools`` (which pools a batch touches),
``events`` (change publishing), ``statistics`` (ANALYZE after bulk writes), ``gpu_state`` (the per-GPU read
model, recomputed for the pools each batch touched).
"""

from fleet.ingest import (
    apply,
    cursors,
    events,
    fleet_kinds,  # noqa: F401  (registers the fleet kinds' specs)
    locks,
    namespaced_kinds,  # noqa: F401  (registers the claim, template, pod and event specs)
    pools,
    rows,
    sql,
    statistics,
)
from fleet.ingest.apply import apply_batch, drop_cluster, get_or_create_cluster, replace_all
from fleet.ingest.events import add_change_listener, change_event, notify_imported, publish
from fleet.ingest.namespaced_kinds import set_claim_hooks
from fleet.ingest.specs import (
    SPECS,
    BatchResult,
    Change,
    ChildSpec,
    CursorUpdate,
    Op,
    TableSpec,
    kinds,
    register,
)
from fleet.ingest.sql import COPY_ROWS, write_rows

__all__ = [
    "COPY_ROWS",
    "SPECS",
    "BatchResult",
    "Change",
    "ChildSpec",
    "CursorUpdate",
    "Op",
    "TableSpec",
    "add_change_listener",
    "apply",
    "apply_batch",
    "change_event",
    "cursors",
    "drop_cluster",
    "events",
    "get_or_create_cluster",
    "kinds",
    "locks",
    "notify_imported",
    "pools",
    "publish",
    "register",
    "replace_all",
    "rows",
    "set_claim_hooks",
    "sql",
    "statistics",
    "write_rows",
]
