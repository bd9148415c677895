"""The shapes of the claim endpoints' rows, for the OpenAPI schema (rows come from ``values()``)."""

from __future__ import annotations

from rest_framework import serializers as s

from fleet.api.serializers import KubeRow
from fleet.models import ResourceClaim


class NamespacedRow(KubeRow):
    namespace = s.CharField()


class ClaimRow(NamespacedRow):
    state = s.ChoiceField(choices=ResourceClaim.STATES)
    requests = s.ListField(child=s.DictField())
    constraints = s.ListField(child=s.DictField())
    reserved_for = s.ListField(child=s.DictField())
    node_name = s.CharField(allow_blank=True)
    owner_pod_name = s.CharField(allow_blank=True)
    allocated_at = s.DateTimeField(allow_null=True)
    since = s.DateTimeField(allow_null=True, help_text="allocated_at, or created_at when not published")
    devices = s.ListField(child=s.CharField(), help_text="Allocated devices as driver/pool/device")


class DiagnosisSummary(s.Serializer):
    category = s.CharField()
    summary = s.CharField(allow_blank=True)
    computed_at = s.DateTimeField()


class PendingRow(NamespacedRow):
    requests = s.ListField(child=s.DictField())
    owner_pod_name = s.CharField(allow_blank=True)
    pod_phase = s.CharField(allow_null=True)
    scheduler_reason = s.CharField(allow_null=True, allow_blank=True)
    scheduler_message = s.CharField(
        allow_null=True, allow_blank=True, help_text="The pod's PodScheduled message"
    )
    diagnosis = DiagnosisSummary(
        allow_null=True, help_text="The latest diagnosis; null until the diagnosis task has seen the claim"
    )


class PodRow(NamespacedRow):
    phase = s.CharField(allow_blank=True)
    node_name = s.CharField(allow_blank=True)
    scheduled_status = s.CharField(allow_blank=True)
    scheduled_reason = s.CharField(allow_blank=True)
    scheduled_message = s.CharField(allow_blank=True)
    scheduled_at = s.DateTimeField(allow_null=True)
    claim_refs = s.ListField(child=s.DictField())
    gpu_requests = s.IntegerField()


class EventRow(NamespacedRow):
    reason = s.CharField()
    type = s.CharField(allow_blank=True)
    message = s.CharField(allow_blank=True)
    involved_kind = s.CharField(allow_blank=True)
    involved_namespace = s.CharField(allow_blank=True)
    involved_name = s.CharField(allow_blank=True)
    involved_uid = s.CharField(allow_blank=True)
    count = s.IntegerField()
    first_at = s.DateTimeField(allow_null=True)
    last_at = s.DateTimeField(allow_null=True)
