"""Claims and what they touch: ResourceClaims, templates, device allocations, pods and scheduling events.

Only ``fleet.ingest`` writes these tables. Rows mirror Kubernetes objects (keyed by (cluster, uid) and by
namespace/name) with derived, indexed fields for the pages and the diagnosis.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from fleet.models import Cluster, Device, KubeObject


class NamespacedObject(KubeObject):
    namespace = models.CharField(max_length=63)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class ResourceClaim(NamespacedObject):
    """A ResourceClaim and its state.

    pending: no allocation yet; allocated: devices chosen, no consumer reserved; reserved: devices chosen and
    ``reservedFor`` names consumers; deallocating: allocated and being deleted.
    """

    STATES = [
        ("pending", "pending"),
        ("allocated", "allocated"),
        ("reserved", "reserved"),
        ("deallocating", "deallocating"),
    ]
    state = models.CharField(max_length=16, choices=STATES)
    requests = models.JSONField(default=list)
    constraints = models.JSONField(default=list)
    reserved_for = models.JSONField(default=list)
    node_name = models.CharField(max_length=253, blank=True)
    owner_pod_uid = models.CharField(max_length=128, blank=True)
    owner_pod_name = models.CharField(max_length=253, blank=True)
    pod_claim_name = models.CharField(max_length=253, blank=True)
    allocated_at = models.DateTimeField(null=True)
    deleted_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="claim_uid"),
            models.UniqueConstraint(fields=["cluster", "namespace", "name"], name="claim_name"),
        ]
        indexes = [models.Index(fields=["cluster", "state"], name="claim_state")]


class ResourceClaimTemplate(NamespacedObject):
    """A ResourceClaimTemplate: the spec the claim controller stamps claims from, one per pod."""

    requests = models.JSONField(default=list)
    constraints = models.JSONField(default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="template_uid"),
            models.UniqueConstraint(fields=["cluster", "namespace", "name"], name="template_name"),
        ]


class DeviceAllocation(models.Model):
    """One device named in a claim's ``status.allocation.devices.results``.

    Linked to the claim by (cluster, claim uid) and to the device by its natural key, without database
    foreign keys: an allocation may arrive before the slice that publishes its device (or outlive it).
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    claim_uid = models.CharField(max_length=128)
    request = models.CharField(max_length=127)
    driver = models.CharField(max_length=63)
    pool = models.CharField(max_length=253)
    device_name = models.CharField(max_length=63)
    admin_access = models.BooleanField(default=False)
    share_id = models.CharField(max_length=64, blank=True)
    consumed_capacity = models.JSONField(default=dict)
    claim = models.ForeignObject(
        ResourceClaim,
        on_delete=models.DO_NOTHING,
        from_fields=["cluster", "claim_uid"],
        to_fields=["cluster", "uid"],
        related_name="allocations",
    )
    device = models.ForeignObject(
        Device,
        on_delete=models.DO_NOTHING,
        from_fields=["cluster", "driver", "pool", "device_name"],
        to_fields=["cluster", "driver", "pool", "name"],
        related_name="allocations",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "claim_uid", "request", "driver", "pool", "device_name", "share_id"],
                name="allocation_key",
            )
        ]
        indexes = [
            models.Index(fields=["cluster", "driver", "pool", "device_name"], name="allocation_device"),
            models.Index(fields=["cluster", "claim_uid"], name="allocation_claim"),
        ]

    def __str__(self) -> str:
        return f"{self.claim_uid}: {self.driver}/{self.pool}/{self.device_name}"


class Pod(NamespacedObject):
    """A pod that uses resource claims or GPU extended resources, with its PodScheduled condition."""

    phase = models.CharField(max_length=32, blank=True)
    node_name = models.CharField(max_length=253, blank=True)
    scheduled_status = models.CharField(max_length=16, blank=True)
    scheduled_reason = models.CharField(max_length=128, blank=True)
    scheduled_message = models.TextField(blank=True)
    scheduled_at = models.DateTimeField(null=True)
    claim_refs = models.JSONField(default=list)
    claim_statuses = models.JSONField(default=list)
    gpu_requests = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="pod_uid"),
            models.UniqueConstraint(fields=["cluster", "namespace", "name"], name="pod_name"),
        ]
        indexes = [models.Index(fields=["cluster", "scheduled_status"], name="pod_scheduled")]


class PodClaimUse(models.Model):
    """A claim a pod uses (by name, in the pod's namespace): the pod's direct references and the claims
    generated from its templates. Written by ingest with the pod (a child row), so "which pods use this
    claim" is an indexed lookup on every database instead of a JSON containment query."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    pod_uid = models.CharField(max_length=128)
    namespace = models.CharField(max_length=63)
    claim_name = models.CharField(max_length=253)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "pod_uid", "claim_name"], name="pod_claim_use_key")
        ]
        indexes = [models.Index(fields=["cluster", "namespace", "claim_name"], name="pod_claim_use_claim")]

    def __str__(self) -> str:
        return f"{self.pod_uid} uses {self.namespace}/{self.claim_name}"


class SchedulingEvent(NamespacedObject):
    """A Kubernetes Event that explains a stuck pod or claim (FailedScheduling and the like)."""

    reason = models.CharField(max_length=128)
    type = models.CharField(max_length=32, blank=True)
    message = models.TextField(blank=True)
    involved_kind = models.CharField(max_length=64, blank=True)
    involved_namespace = models.CharField(max_length=63, blank=True)
    involved_name = models.CharField(max_length=253, blank=True)
    involved_uid = models.CharField(max_length=128, blank=True)
    count = models.IntegerField(default=1)
    first_at = models.DateTimeField(null=True)
    last_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="event_uid"),
            models.UniqueConstraint(fields=["cluster", "namespace", "name"], name="event_name"),
        ]
        indexes = [models.Index(fields=["cluster", "involved_uid"], name="event_involved")]


class ClaimDiagnosis(models.Model):
    """The latest diagnosis of a pending claim (``claims.diagnosis``).

    ``result`` is the full result object (category, summary, requests, suggestions, placement, lint);
    ``computed_at`` says how fresh it is. One writer: the diagnosis task (``claims.tasks``); pages and the
    API only read it, and compute a missing one without storing it.
    """

    claim = models.OneToOneField(ResourceClaim, on_delete=models.CASCADE, related_name="diagnosis")
    category = models.CharField(max_length=32, db_index=True)
    summary = models.TextField()
    result = models.JSONField(default=dict)
    computed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.claim}: {self.category}"


class NamespaceGrant(models.Model):
    """Lets a user see the claims, pods and events of one namespace (``dashboard.visibility``).

    ``cluster`` null means the namespace of that name in every cluster. Users see no namespace unless granted
    one here, or given the ``claims.view_all_namespaces`` permission, or are superusers. Edited in the admin.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="namespace_grants"
    )
    cluster = models.ForeignKey(
        Cluster,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        help_text="Empty: this namespace in every cluster.",
    )
    namespace = models.CharField(max_length=63)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "cluster", "namespace"], name="grant_key"),
            models.UniqueConstraint(
                fields=["user", "namespace"],
                condition=models.Q(cluster__isnull=True),
                name="grant_key_all_clusters",
            ),
        ]
        permissions = [("view_all_namespaces", "Can see claims, pods and events in every namespace")]

    def __str__(self) -> str:
        where = self.cluster.name if self.cluster is not None else "*"
        return f"{self.user}: {where}/{self.namespace}"


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


class KubeIdentity(models.Model):
    """The Kubernetes identity of a single-sign-on user: the username and groups the clusters' API servers
    give the same OIDC token (``CLAIMSCOPE_RBAC_*`` claims and prefixes). In ``CLAIMSCOPE_VISIBILITY=
    kubernetes`` the clusters' RBAC is asked what this identity may list (``dashboard.kube_rbac``).
    Written at each OIDC login by ``dashboard.oidc``."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="kube_identity"
    )
    username = models.CharField(max_length=253)
    groups = models.JSONField(default=list)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.username} {self.groups}"
