"""The allocation chart (history samples) and the overview table count a model's compute slices alike.

Both read the per-GPU read model (the overview scoped to GPU and MIG devices, the sampler through
``selectors.fleet_summary``): a sample taken now must show what the table shows now, on the varied fleet
(stale generations, blocked and tainted devices, adminAccess and orphaned allocations)."""

from django.utils import timezone

from fleet import overview
from fleet.filters import FleetFilter
from fleet.models import AllocationSample
from fleet.tasks.history import sample_allocation
from fleet.views import _clusters
from tests.fleet_pages.test_overview_counts import varied_fleet


def test_a_history_sample_is_what_the_overview_table_shows(fleet):
    varied_fleet()
    now = timezone.now().replace(second=0, microsecond=0)
    sample_allocation(now.isoformat())
    table = {
        (c.name, m.model): (m.compute_slices_allocated, m.compute_slices)
        for c in overview.load_cluster_overviews(FleetFilter(), _clusters(FleetFilter()))
        for m in c.summary.models
    }
    chart = {
        (s.cluster.name, s.model): (s.allocated, s.total)
        for s in AllocationSample.objects.filter(time=now, profile="").select_related("cluster")
    }
    assert chart == table
    assert any(allocated for allocated, _ in table.values())  # something is allocated to compare
