"""The analysis' own tables: the latest diagnosis of each pending claim, the causes it gave, and the
history of every claim's states (for triage). The mirrored Kubernetes objects they refer to live in
``fleet.models``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.db import models

from claims.shaped import put_names
from fleet.models import Cluster, ResourceClaim


class DiagnosisShape(models.Model):
    """A diagnosis as computed, shared by the pending claims of one shape (``claims.tasks.Shapes``).

    Claims made from one template pend by the thousand and read the fleet alike: their diagnosis is
    computed once, and stored once, so that an update of the fleet's counts rewrites a few rows, not one
    per claim. ``key`` is the digest of the shape (``claim-<id>`` for a claim diagnosed alone). When
    ``named``, the result and summary hold the placeholders of ``claims.shaped``, and each claim reads them
    with its own names put back (``ClaimDiagnosis.result``). ``group_key`` is the result's cause
    (``claims.causes.cause_of``), which never reads names. One writer: the diagnosis task."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    key = models.CharField(max_length=64)
    named = models.BooleanField(default=False)
    category = models.CharField(max_length=32, db_index=True)
    summary = models.TextField()
    result = models.JSONField(default=dict)
    group_key = models.CharField(max_length=64, blank=True, default="")
    computed_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "key"], name="diagnosis_shape_key")]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.key}: {self.category}"


class ClaimDiagnosis(models.Model):
    """The latest diagnosis of a pending claim (``claims.diagnosis``): its shape's, read with the claim's
    own names (``result``, ``summary``; ``pod_name`` is the pod the diagnosis names). Reading them reads
    ``claim`` and ``shape``: select them with the row. One writer: the diagnosis task (``claims.tasks``);
    pages and the API only read it, and compute a missing one without storing it."""

    claim = models.OneToOneField(ResourceClaim, on_delete=models.CASCADE, related_name="diagnosis")
    shape = models.ForeignKey(DiagnosisShape, on_delete=models.CASCADE)
    pod_name = models.CharField(max_length=253, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.claim}: {self.category}"

    def _named(self, text: str) -> str:
        return put_names(text, self.claim.name, self.claim.uid, self.pod_name, named=self.shape.named)

    @property
    def category(self) -> str:
        return self.shape.category

    @property
    def group_key(self) -> str:
        return self.shape.group_key

    @property
    def computed_at(self) -> datetime:
        return self.shape.computed_at

    @property
    def summary(self) -> str:
        return self._named(self.shape.summary)

    @property
    def result(self) -> Any:
        if not self.shape.named:
            return self.shape.result
        return json.loads(self._named(json.dumps(self.shape.result)))  # rare reads: the stdlib will do


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
