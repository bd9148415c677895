"""Claims and what they touch: ResourceClaims, templates, device allocations, pods and scheduling events.

Only ``fleet.ingest`` writes these tables. Rows mirror Kubernetes objects (keyed by (cluster, uid) and by
namespace/name) with derived, indexed fields for the pages and the diagnosis.
"""

from __future__ import annotations

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
    """The latest diagnosis of a pending claim (``claims.diagnosis``), recomputed by ``claims.tasks``.

    ``result`` is the full result object (category, summary, requests, suggestions, placement, lint);
    ``computed_at`` says how fresh it is.
    """

    claim = models.OneToOneField(ResourceClaim, on_delete=models.CASCADE, related_name="diagnosis")
    category = models.CharField(max_length=32, db_index=True)
    summary = models.TextField()
    result = models.JSONField(default=dict)
    computed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.claim}: {self.category}"
