"""Measured utilization of the fleet's devices, joined to who holds them.

Only ``usage.ingest`` writes these tables. The per-device time series stay in Prometheus (charts read it
there); what is kept here is what the pages need without asking Prometheus: the latest sample of every
device, each holding's idle accounting, per-(model, namespace) trends and each cluster's sampling state.
"""

from __future__ import annotations

from django.db import models

from fleet.models import Cluster


class DeviceUsage(models.Model):
    """The latest sample of one device (a full GPU or a MIG device), keyed like ``fleet.Device``.

    ``active`` is the graphics-engine activity in 0..1 (``DCGM_FI_PROF_GR_ENGINE_ACTIVE``, or
    ``DCGM_FI_DEV_GPU_UTIL``/100 when the profiling metric is absent); null means the last round had no
    value for the device (a gap), never 0. ``idle_since`` is set while the device is allocated and below
    the idle threshold.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    driver = models.CharField(max_length=63)
    pool = models.CharField(max_length=253)
    device = models.CharField(max_length=63)
    gpu_uuid = models.CharField(max_length=128, blank=True)
    instance_id = models.CharField(max_length=16, blank=True)
    matched_by = models.CharField(max_length=16)
    namespace = models.CharField(max_length=63, blank=True)
    claim = models.CharField(max_length=253, blank=True)
    active = models.FloatField(null=True)
    fb_used_bytes = models.BigIntegerField(null=True)
    fb_total_bytes = models.BigIntegerField(null=True)
    power_watts = models.FloatField(null=True)
    sampled_at = models.DateTimeField()
    idle_since = models.DateTimeField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "driver", "pool", "device"], name="usage_device"),
        ]

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}@{self.sampled_at:%H:%M}"


class ClaimUsage(models.Model):
    """How one claim used one device it held, accumulated over the rounds that saw it allocated.

    ``idle_seconds`` adds up the time between rounds whose sample was below the idle threshold; a round
    without a value for the device (a gap) adds neither idle nor active time and is counted in
    ``gap_samples``. ``idle_since`` is the start of the current idle stretch (null while active).
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    namespace = models.CharField(max_length=63)
    claim = models.CharField(max_length=253)
    driver = models.CharField(max_length=63)
    pool = models.CharField(max_length=253)
    device = models.CharField(max_length=63)
    node = models.CharField(max_length=253, blank=True)
    model = models.CharField(max_length=16)
    profile = models.CharField(max_length=64, blank=True)
    gpu_fraction = models.FloatField(help_text="compute slices / 7: a full GPU is 1")
    first_seen = models.DateTimeField()
    last_seen = models.DateTimeField()
    samples = models.IntegerField(default=0)
    gap_samples = models.IntegerField(default=0)
    active_sum = models.FloatField(default=0.0)
    observed_seconds = models.FloatField(default=0.0)
    idle_seconds = models.FloatField(default=0.0)
    idle_since = models.DateTimeField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "namespace", "claim", "driver", "pool", "device"], name="usage_holding"
            )
        ]
        indexes = [models.Index(fields=["last_seen"], name="usage_holding_seen")]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.claim} on {self.pool}/{self.device}"


class UsageTrend(models.Model):
    """Allocation against utilization of a (cluster, model, namespace) group at one time, in GPUs.

    ``allocated`` counts held GPUs (MIG devices as their fraction of a GPU), ``active`` the same weighted by
    measured activity, ``idle`` the held GPUs below the idle threshold; ``measured`` the held GPUs that had
    a value (the rest were gaps). ``namespace`` is empty for what nobody holds. "minute" points are kept
    7 days and folded into "hour" points kept a year (``usage.tasks.downsample_trends``).
    """

    RESOLUTIONS = [("minute", "minute"), ("hour", "hour")]
    time = models.DateTimeField()
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE)
    model = models.CharField(max_length=16)
    namespace = models.CharField(max_length=63, blank=True)
    resolution = models.CharField(max_length=8, choices=RESOLUTIONS, default="minute")
    allocated = models.FloatField()
    measured = models.FloatField()
    active = models.FloatField()
    idle = models.FloatField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "model", "namespace", "resolution", "time"], name="usage_trend_point"
            )
        ]
        indexes = [models.Index(fields=["resolution", "time"], name="usage_trend_time")]

    def __str__(self) -> str:
        return f"{self.cluster_id}/{self.model}/{self.namespace or '-'}@{self.time:%Y-%m-%d %H:%M}"


class SamplingState(models.Model):
    """Where the sampling of one cluster's utilization stands: the last round's counts and errors.

    ``unavailable_since`` is set by the first failed round and cleared by the next good one, so pages can
    say "utilization unavailable since …". ``unmatched`` counts the series that named no known device, by
    reason, and ``unmatched_examples`` keeps a few of their label sets to show.
    """

    cluster = models.OneToOneField(Cluster, on_delete=models.CASCADE, related_name="sampling")
    last_round_at = models.DateTimeField(null=True)
    last_ok_at = models.DateTimeField(null=True)
    unavailable_since = models.DateTimeField(null=True)
    last_error = models.TextField(blank=True)
    series = models.IntegerField(default=0)
    matched = models.IntegerField(default=0)
    unmatched = models.JSONField(default=dict)
    unmatched_examples = models.JSONField(default=list)
    query_seconds = models.FloatField(default=0.0)
    round_seconds = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"sampling of {self.cluster_id}"
