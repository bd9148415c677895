"""The fleet as Kubernetes publishes it: clusters, nodes, device classes, ResourceSlices and their devices,
claims and their allocations, pods and events; with the tables that serve it (watch cursors, allocation
history, API tokens, audit, who may see which namespaces).

Only ``fleet.ingest`` writes the mirrored tables; every other model names its one writer. Every
Kubernetes object is keyed by (cluster, uid) and by its natural key, and keeps its resourceVersion (an
integer of up to 128 bits: comparable from Kubernetes 1.35 on) and its raw JSON (without managedFields).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models

RESOURCE_VERSION_DIGITS = 39  # 2**128 - 1 has 39 decimal digits


def resource_version_field() -> models.DecimalField:
    return models.DecimalField(max_digits=RESOURCE_VERSION_DIGITS, decimal_places=0)


class TextJSONField(models.JSONField):
    """A JSON column PostgreSQL keeps as the text written (``json``, not ``jsonb``).

    For the large columns nothing looks inside in SQL: the mirrored objects' ``raw``, a device's
    attributes and capacity. ``jsonb`` parses each value into its binary form when it is written and
    prints it back to text when it is read, and text is all we send and take: on the L fleet's slices
    that is 1.7-1.9 s of the server's CPU to write them against 0.8-0.9 s for ``json``, and 1.0 s to read
    them back as text against 0.08 s (bench/README.md, "JSON kept as text"). ``json`` has no equality
    operator: such a column is never compared, grouped or made DISTINCT in SQL. Other databases store
    JSON as text already and keep Django's type."""

    def db_type(self, connection: Any) -> str | None:
        if connection.vendor == "postgresql":
            return "json"
        return super().db_type(connection)


class Cluster(models.Model):
    """A Kubernetes cluster (or a simulated one) whose objects we mirror."""

    name = models.SlugField(max_length=63, unique=True)
    description = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class KubeObject(models.Model):
    """Fields every mirrored Kubernetes object has."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    uid = models.CharField(max_length=128)
    name = models.CharField(max_length=253)
    resource_version = resource_version_field()
    created_at = models.DateTimeField(null=True)
    labels = models.JSONField(default=dict)
    raw = TextJSONField()
    synced_at = models.DateTimeField()

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return self.name


class Node(KubeObject):
    """A Kubernetes Node. GPU nodes carry NVIDIA's labels (product, clique)."""

    ready = models.BooleanField(default=False)
    unschedulable = models.BooleanField(default=False)
    gpu_product = models.CharField(max_length=128, blank=True, db_index=True)
    clique = models.CharField(max_length=128, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="node_uid"),
            models.UniqueConstraint(fields=["cluster", "name"], name="node_name"),
        ]


class DeviceClass(KubeObject):
    """A DeviceClass: the CEL selectors every request naming it must also pass."""

    selectors = models.JSONField(default=list)
    extended_resource_name = models.CharField(max_length=253, blank=True)

    class Meta:
        verbose_name_plural = "device classes"
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="deviceclass_uid"),
            models.UniqueConstraint(fields=["cluster", "name"], name="deviceclass_name"),
        ]


class DeviceTaintRule(KubeObject):
    """A DeviceTaintRule (``resource.k8s.io/v1``): one taint for the devices its selector selects. Ingest
    applies it to their ``Device.taints`` (:mod:`fleet.taint_rules`), so every count sees it as a taint."""

    selector = models.JSONField(null=True)  # {"driver", "pool", "device"}: None in it means any; null: none
    taint = models.JSONField(default=dict)
    effect = models.CharField(max_length=64, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="devicetaintrule_uid"),
            models.UniqueConstraint(fields=["cluster", "name"], name="devicetaintrule_name"),
        ]


class ResourceSlice(KubeObject):
    """One ResourceSlice: part of a driver's pool, at a pool generation."""

    driver = models.CharField(max_length=63)
    pool = models.CharField(max_length=253)
    pool_generation = models.BigIntegerField()
    pool_slice_count = models.IntegerField()
    node_name = models.CharField(max_length=253, blank=True, db_index=True)
    all_nodes = models.BooleanField(default=False)
    per_device_node_selection = models.BooleanField(default=False)
    shared_counters = models.JSONField(default=list)
    device_count = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="slice_uid"),
            models.UniqueConstraint(fields=["cluster", "name"], name="slice_name"),
        ]
        indexes = [models.Index(fields=["cluster", "pool", "driver"], name="slice_pool")]


class Device(models.Model):
    """A device published in a ResourceSlice, identified by (cluster, driver, pool, name).

    ``gpu_uuid`` names the physical GPU the device belongs to (its own uuid, or the MIG parent's):
    MIG slices of one GPU share it, so their memory is never added to the GPU's. ``taints`` are the
    published ones followed by those of the DeviceTaintRules selecting the device (each naming its rule,
    :mod:`fleet.taint_rules`); ``tainted`` covers both.
    """

    KINDS = [("gpu", "GPU"), ("mig", "MIG"), ("vfio", "VFIO"), ("channel", "channel"), ("other", "other")]

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    driver = models.CharField(max_length=63)
    pool = models.CharField(max_length=253)
    name = models.CharField(max_length=63)
    slice_name = models.CharField(max_length=253)
    pool_generation = models.BigIntegerField()
    node_name = models.CharField(max_length=253, blank=True)
    kind = models.CharField(max_length=8, choices=KINDS)
    model = models.CharField(max_length=16)
    product_name = models.CharField(max_length=128, blank=True)
    uuid = models.CharField(max_length=128, blank=True)
    parent_uuid = models.CharField(max_length=128, blank=True)
    gpu_uuid = models.CharField(max_length=128, blank=True)
    gpu_minor = models.IntegerField(null=True)
    mig_profile = models.CharField(max_length=64, blank=True)
    compute_slices = models.SmallIntegerField(default=0)
    memory_bytes = models.BigIntegerField(null=True)
    taints = models.JSONField(default=list)
    tainted = models.BooleanField(default=False)
    counters_consumed = models.JSONField(default=list)
    attributes = TextJSONField(default=dict)
    capacity = TextJSONField(default=dict)
    slice = models.ForeignObject(
        ResourceSlice,
        on_delete=models.DO_NOTHING,
        from_fields=["cluster", "slice_name"],
        to_fields=["cluster", "name"],
        related_name="devices",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "pool", "driver", "name"], name="device_key"),
        ]
        indexes = [
            models.Index(fields=["cluster", "model", "kind"], name="device_model"),
            models.Index(fields=["cluster", "node_name"], name="device_node"),
            models.Index(fields=["cluster", "gpu_uuid"], name="device_gpu"),
            models.Index(fields=["cluster", "slice_name"], name="device_slice"),
            models.Index(fields=["mig_profile"], name="device_profile"),
        ]

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"


class WatchCursor(models.Model):
    """Where one (cluster, kind) stream stands: its resourceVersion, state, last event and last error.

    Written by ``fleet.ingest.cursors`` only: the position with each batch or relist (in its transaction),
    the state and errors the reflector reports, the leases the streams' heartbeat renews."""

    STATES = [
        ("idle", "idle"),
        ("listing", "listing"),
        ("watching", "watching"),
        ("backoff", "backoff"),
        ("forbidden", "forbidden"),
        ("error", "error"),
    ]
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="cursors")
    kind = models.CharField(max_length=32)
    resource_version = models.DecimalField(max_digits=RESOURCE_VERSION_DIGITS, decimal_places=0, default=0)
    state = models.CharField(max_length=16, choices=STATES, default="idle")
    object_count = models.IntegerField(default=0)
    # Lists that replaced a position the stream already had (after a 410 Gone, an interrupted list, a
    # server that went back in time), counted with the list's transaction; the first list is not one.
    relists = models.PositiveBigIntegerField(default=0)
    last_event_at = models.DateTimeField(null=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Until when the stream's worker has vouched for it: its heartbeat pushes this forward while a round
    # runs, and a round's end sets it past the delay before the next round. Past it, ``state`` is only
    # what a worker last wrote, not what is happening: see :func:`stream_status`.
    lease_until = models.DateTimeField(null=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "kind"], name="cursor_stream")]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.kind}@{self.resource_version}"

    def status(self, now: datetime) -> str:
        return stream_status(self.state, self.lease_until, now)


def stream_status(state: str, lease_until: datetime | None, now: datetime) -> str:
    """A stream's state as it is now: ``stale`` when no worker has reported within the lease (dead,
    frozen, cut off from the database, or never started since leases exist), else the recorded state."""
    if lease_until is None or lease_until < now:
        return "stale"
    return state


class AllocationSample(models.Model):
    """One point of the allocation history of a (cluster, model, MIG profile) group.

    ``profile`` is empty for a model's physical GPUs, counted in compute slices (partition-aware, 7 per GPU);
    a MIG profile's row counts its devices. ``resolution`` is "minute" for raw samples (kept 30 days) and
    "hour" for their hourly averages (kept a year). Written by ``fleet.tasks.history`` only.
    """

    RESOLUTIONS = [("minute", "minute"), ("hour", "hour")]
    time = models.DateTimeField()
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="samples")
    model = models.CharField(max_length=16)
    profile = models.CharField(max_length=64, blank=True)
    resolution = models.CharField(max_length=8, choices=RESOLUTIONS, default="minute")
    total = models.FloatField()
    allocated = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "model", "profile", "resolution", "time"], name="sample_point"
            )
        ]
        indexes = [models.Index(fields=["resolution", "time"], name="sample_time")]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.model}/{self.profile or 'gpu'}@{self.time:%Y-%m-%d %H:%M}"


class ApiToken(models.Model):
    """A user's API token, stored as its SHA-256 digest: the key itself is shown once, at creation.

    A plain hash (no salt, no key stretching) is enough because the key is 256 random bits, not a password:
    nothing to guess, and lookups stay one indexed query. Written by ``fleet.api.tokens`` only (the
    authentication class there stamps ``last_used_at``).
    """

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_token")
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="The key's first characters, to recognise it")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user_id})"


class AuditEvent(models.Model):
    """Who did what, from where: logins and their failures, token creation, use and revocation, exports.

    Written by ``fleet.access.audit.record`` only, which also logs each event on ``claimscope.audit``.
    """

    at = models.DateTimeField(db_index=True)
    action = models.CharField(max_length=32, db_index=True)
    username = models.CharField(max_length=150, blank=True, db_index=True)
    ip = models.CharField(max_length=45, blank=True)
    detail = models.JSONField(default=dict)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.action} {self.username}"


# ------------------------------------------------------------------ claims, pods and events (namespaced)


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
        db_table = "claims_resourceclaim"  # the table kept its name when the model moved from claims
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
        db_table = "claims_resourceclaimtemplate"  # the table kept its name when the model moved from claims
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
        db_table = "claims_deviceallocation"  # the table kept its name when the model moved from claims
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "claim_uid", "request", "driver", "pool", "device_name", "share_id"],
                name="allocation_key",
            )
        ]
        indexes = [
            models.Index(fields=["cluster", "pool", "driver", "device_name"], name="allocation_device"),
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
        db_table = "claims_pod"  # the table kept its name when the model moved from claims
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="pod_uid"),
            models.UniqueConstraint(fields=["cluster", "namespace", "name"], name="pod_name"),
        ]
        indexes = [
            models.Index(fields=["cluster", "scheduled_status"], name="pod_scheduled"),
            # The pods not bound to a node: what the pending page lists beside the claims, read on every
            # request (two scans of every pod at XL, 70-80 ms each, for a few thousand rows).
            models.Index(
                fields=["cluster", "namespace"], condition=models.Q(node_name=""), name="pod_unbound"
            ),
        ]


class PodClaimUse(models.Model):
    """A claim a pod uses (by name, in the pod's namespace): the pod's direct references and the claims
    generated from its templates. Written by ingest with the pod (a child row), so "which pods use this
    claim" is an indexed lookup on every database instead of a JSON containment query."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    pod_uid = models.CharField(max_length=128)
    namespace = models.CharField(max_length=63)
    claim_name = models.CharField(max_length=253)

    class Meta:
        db_table = "claims_podclaimuse"  # the table kept its name when the model moved from claims
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
        db_table = "claims_schedulingevent"  # the table kept its name when the model moved from claims
        constraints = [
            models.UniqueConstraint(fields=["cluster", "uid"], name="event_uid"),
            models.UniqueConstraint(fields=["cluster", "namespace", "name"], name="event_name"),
        ]
        indexes = [models.Index(fields=["cluster", "involved_uid"], name="event_involved")]


# ------------------------------------------------------------------ tenancy: who sees which namespaces


class NamespaceGrant(models.Model):
    """Lets a user see the claims, pods and events of one namespace (``fleet.access.visibility``).

    ``cluster`` null means the namespace of that name in every cluster. Users see no namespace unless granted
    one here, or given the ``fleet.view_all_namespaces`` permission, or are superusers. Written by
    ``fleet.access.grants`` (single sign-on) and edited in the admin.
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
        db_table = "claims_namespacegrant"  # the table kept its name when the model moved from claims
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


class KubeIdentity(models.Model):
    """The Kubernetes identity of a single-sign-on user: the username and groups the clusters' API servers
    give the same OIDC token (``CLAIMSCOPE_RBAC_*`` claims and prefixes). In ``CLAIMSCOPE_VISIBILITY=
    kubernetes`` the clusters' RBAC is asked what this identity may list (``fleet.access.kube_rbac``).
    Written at each OIDC login by ``fleet.access.grants``."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="kube_identity"
    )
    username = models.CharField(max_length=253)
    groups = models.JSONField(default=list)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "claims_kubeidentity"  # the table kept its name when the model moved from claims

    def __str__(self) -> str:
        return f"{self.username} {self.groups}"


class GpuState(models.Model):
    """The per-GPU read model: one row per physical GPU of a pool's current generation, with what the
    pages count of it (:mod:`fleet.counts`: :class:`~fleet.counts.GpuFlags`), so that home, the overview,
    the summary, ``fleet_summary``, ``/metrics`` and the API read plain indexed rows, the same on SQLite and
    PostgreSQL, instead of judging every device on each request.

    Written only by ``fleet.ingest.gpu_state``, in the same transaction as the devices and allocations it
    derives from (recomputed per touched pool, or per held GPU for a claim batch; a GPU's devices are
    published in one pool).
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    driver = models.CharField(max_length=63)
    pool = models.CharField(max_length=253)
    gpu_uuid = models.CharField(max_length=128)
    node_name = models.CharField(max_length=253, blank=True)
    model = models.CharField(max_length=16)
    gpu_minor = models.IntegerField(null=True)
    mig = models.BooleanField(default=False)  # carries MIG devices, static or dynamic
    dynamic = models.BooleanField(default=False)  # partitionable (dynamic MIG)
    whole_allocated = models.BooleanField(default=False)  # its full-GPU device is allocated
    tainted = models.BooleanField(default=False)  # one of its devices carries a NoSchedule/NoExecute taint
    taints = models.JSONField(default=list)  # its devices' taints as "key=value:Effect", once each
    compute_slices_used = models.SmallIntegerField(default=0)  # of its allocated devices, uncapped
    compute_slices_allocated = models.SmallIntegerField(default=0)  # capped at 7: the count pages show
    devices = models.IntegerField(default=0)
    devices_allocated = models.IntegerField(default=0)
    partitions_free = models.IntegerField(default=0)
    partitions_unavailable = models.IntegerField(default=0)  # tainted, or blocked by shared counters
    reserved = models.BooleanField(default=False)  # held by a claim a consumer uses
    unreserved = models.BooleanField(default=False)  # held by a claim nobody uses: a suspected leak
    holders = models.JSONField(default=list)  # "namespace/name" of the claims holding its devices
    claims = models.IntegerField(default=0)  # how many: the heatmap reads this, not the list
    # A device of it is blocked by the counters its allocated siblings use (the heatmap's rule:
    # fleet.heatmap.blocked_devices), and its MIG layout as the heatmap shows it (fleet.heatmap.layout).
    counter_blocked = models.BooleanField(default=False)
    layout = models.TextField(blank=True)
    product_name = models.CharField(max_length=128, blank=True)  # the driver's productName attribute
    mig_devices = models.IntegerField(default=0)  # of its devices, the MIG ones (the API's GPU rows)
    tainted_devices = models.IntegerField(default=0)
    # Of the recompute that wrote the row: per cluster, each recompute's is above every earlier one's
    # (taken under the read-model lock), so a pool's (rows, newest revision) changes whenever it is
    # recomputed: what the live feed polls (fleet.selectors.pool_versions).
    revision = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "driver", "pool", "gpu_uuid"], name="gpustate_key")
        ]
        indexes = [
            models.Index(fields=["cluster", "model"], name="gpustate_model"),
            models.Index(fields=["cluster", "pool"], name="gpustate_pool"),
            models.Index(fields=["cluster", "revision"], name="gpustate_revision"),
            models.Index(fields=["cluster", "node_name"], name="gpustate_node"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.pool}/{self.gpu_uuid}"


class DeviceGroupState(models.Model):
    """The read model's device counts: per unit of :func:`fleet.counts.units` (a physical GPU, or a device
    outside any GPU) and (model, kind, MIG profile), its devices by state. Summing rows gives the
    overview's and the summary's groups, with a plain ``GROUP BY``.

    Written only by ``fleet.ingest.gpu_state``, with :class:`GpuState`.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    driver = models.CharField(max_length=63)
    pool = models.CharField(max_length=253)
    unit = models.CharField(max_length=400)  # "gpu:<uuid>" or "device:<driver>/<pool>/<name>"
    node_name = models.CharField(max_length=253, blank=True)
    model = models.CharField(max_length=16)
    kind = models.CharField(max_length=8)
    profile = models.CharField(max_length=64, blank=True)
    total = models.IntegerField(default=0)
    allocated = models.IntegerField(default=0)
    reserved = models.IntegerField(default=0)
    unavailable = models.IntegerField(default=0)
    tainted = models.IntegerField(default=0)
    free = models.IntegerField(default=0)
    memory_bytes = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "driver", "pool", "unit", "model", "kind", "profile"],
                name="devicegroup_key",
            )
        ]
        indexes = [
            models.Index(fields=["cluster", "model", "kind"], name="devicegroup_model"),
            models.Index(fields=["cluster", "pool"], name="devicegroup_pool"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.unit}/{self.kind}/{self.profile}"


class ReadModelVersion(models.Model):
    """Per cluster, a token that changes in every transaction that recomputes some of its read-model rows
    (:class:`GpuState`, :class:`DeviceGroupState`): what per-process caches of the read model's aggregates
    compare (:mod:`fleet.readmodel`). Random, not a counter: a test database rolled back or flushed reuses
    cluster ids (SQLite), and a counter would start over and match an entry cached before.

    Written only by ``fleet.ingest.gpu_state``, with the rows.
    """

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, primary_key=True)
    token = models.BigIntegerField()
    # A first list left the whole cluster's recompute to the next one (``gpu_state.after_first_list``):
    # the next recompute of the cluster recomputes all of it, and clears this.
    owed = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.cluster_id}@{self.token}"
