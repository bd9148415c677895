"""The analysis' own tables: the latest diagnosis of each pending claim, the causes it gave, and the
history of every claim's states (for triage). The mirrored Kubernetes objects they refer to live in
``fleet.models``.
"""

from __future__ import annotations

from django.db import models

from fleet.models import Cluster, ResourceClaim


class ClaimDiagnosis(models.Model):
    """The latest diagnosis of a pending claim (``claims.diagnosis``).

    ``result`` is the full result object (category, summary, requests, suggestions, placement, lint);
    ``computed_at`` says how fresh it is. ``group_key`` is the result's cause (``claims.causes.cause_of``),
    kept beside it so that the pending list groups its rows without reading every result; empty on a row
    stored before the column, whose key is then computed from the result. One writer: the diagnosis task
    (``claims.tasks``); pages and the API only read it, and compute a missing one without storing it.
    """

    claim = models.OneToOneField(ResourceClaim, on_delete=models.CASCADE, related_name="diagnosis")
    category = models.CharField(max_length=32, db_index=True)
    summary = models.TextField()
    result = models.JSONField(default=dict)
    # A database default too: a worker of the previous release, still writing while this one migrates,
    # leaves the column out.
    group_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    computed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.claim}: {self.category}"


# ------------------------------------------------------------------------------------------- history
# Written by ``claims.history`` from inside fleet.ingest's transaction (its hook on the claim kind), so the
# history of a claim never disagrees with the mirrored claim table.

CLAIM_STATES_EVER = [*ResourceClaim.STATES, ("deleted", "deleted")]


class ClaimLifecycle(models.Model):
    """One row per claim ever seen (by cluster and uid): when it was created, first pending, last allocated
    (where, on which devices), released and deleted. ``state`` is the last state recorded; the hook compares
    each observed claim with it to find changes.

    Times are Kubernetes' own when the object carries one (creationTimestamp, deletionTimestamp,
    allocationTimestamp), else the time the ingest batch observed the change. One writer: ``claims.history``
    (ingest's claim hooks, in the batch's transaction; and its pruning, run by ``claims.tasks``).
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    uid = models.CharField(max_length=128)
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    state = models.CharField(max_length=16, choices=CLAIM_STATES_EVER)
    created_at = models.DateTimeField(null=True)
    first_pending_at = models.DateTimeField(null=True, help_text="Null: never seen pending")
    allocated_at = models.DateTimeField(null=True)
    node = models.CharField(max_length=253, blank=True)
    devices = models.JSONField(default=list, help_text="driver/pool/device of the last allocation")
    released_at = models.DateTimeField(null=True)
    deleted_at = models.DateTimeField(null=True)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "uid"], name="lifecycle_uid")]
        indexes = [models.Index(fields=["cluster", "namespace", "name"], name="lifecycle_name")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}: {self.state}"


class ClaimStateChange(models.Model):
    """Append-only: a claim went from one state to another at ``at`` (``from_state`` empty: first seen;
    ``to_state`` "deleted": gone). ``node`` and ``devices`` are those of the allocation made or released.
    One writer: ``claims.history`` (ingest's claim hooks; and its pruning, run by ``claims.tasks``)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    uid = models.CharField(max_length=128)
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, choices=CLAIM_STATES_EVER)
    at = models.DateTimeField()
    node = models.CharField(max_length=253, blank=True)
    devices = models.JSONField(default=list)

    class Meta:
        indexes = [
            models.Index(fields=["cluster", "uid", "at"], name="change_claim"),
            models.Index(fields=["at"], name="change_at"),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}: {self.from_state or '-'} -> {self.to_state} at {self.at}"


class PendingCause(models.Model):
    """A cause the diagnosis gave for a claim while it was pending, kept after the claim is allocated or
    deleted (the triage reports causes of the weekend's claims on Monday). One row per (claim, category,
    group key); ``first_seen``/``last_seen`` bracket the diagnoses that gave it. One writer: the diagnosis
    task (``claims.tasks``: recorded with each recompute, pruned daily).
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    uid = models.CharField(max_length=128)
    namespace = models.CharField(max_length=63)
    name = models.CharField(max_length=253)
    category = models.CharField(max_length=32)
    group_key = models.CharField(max_length=255, blank=True, help_text="claims.causes.cause_of(...).key")
    summary = models.TextField()
    result = models.JSONField(default=dict, help_text="The latest diagnosis result giving this cause")
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "uid", "category", "group_key"], name="pending_cause_key"
            )
        ]
        indexes = [models.Index(fields=["cluster", "uid"], name="pending_cause_claim")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}: {self.category}"
