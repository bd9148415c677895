"""Pure heatmap builders: GPU records from the per-GPU read model, and rows derived from them per filter."""

from __future__ import annotations

import pytest

from fleet import heatmap
from fleet.filters import FleetFilter

NAMES = {1: "a", 2: "b"}


def gpu(cid=1, node="n1", index=0, model="H100", pool="n1", used=0, flags=0, layout="", claims=0, uuid=""):
    return heatmap.Gpu(
        cid,
        "gpu.nvidia.com",
        pool,
        uuid or f"{node}-{index}",
        node,
        model,
        index,
        used,
        flags,
        layout,
        claims,
    )


def test_read_model_rows_become_records_with_flags_and_the_pool_for_a_missing_node():
    rows = [
        # cluster, driver, pool, uuid, node, model, index, used, tainted, reserved, unreserved,
        # counter blocked, layout, claims
        (1, "d", "p", "u0", "n", "H100", 0, 3, True, True, False, False, "3g.40gb 2g.20gb 1g.10gb", 2),
        (1, "d", "p", "u1", "n", "H100", 1, 2, False, False, True, True, "dynamic 2g.20gb", 1),
        (1, "d", "p", "u2", "", "H100", 2, 0, False, False, False, False, "dynamic", 0),
    ]
    static, dynamic, idle = heatmap.gpus_of_states(rows)
    assert static.layout == "3g.40gb 2g.20gb 1g.10gb" and static.claims == 2
    assert static.flags == heatmap.TAINTED | heatmap.RESERVED
    assert dynamic.layout == "dynamic 2g.20gb" and dynamic.flags == heatmap.UNRESERVED | heatmap.UNAVAILABLE
    assert idle.layout == "dynamic" and idle.claims == 0 and idle.flags == 0 and idle.node == "p"


def test_rows_are_filtered_per_gpu_and_take_model_and_pool_from_the_lowest_index():
    gpus = [
        gpu(index=1, model="B200", pool="p2", used=9),
        gpu(index=0, model="H100", pool="p1", flags=heatmap.TAINTED),
        gpu(cid=2, node="m", index=None),
        gpu(cid=3, node="gone"),  # a cluster not asked for
    ]
    rows = heatmap.rows_of(gpus, NAMES, {}, FleetFilter())
    assert rows == {
        "a/n1": ["a", "n1", "H100", "p1", [[0, 0, 1, "", 0], [1, 7, 0, "", 0]]],
        "b/m": ["b", "m", "H100", "n1", [[0, 0, 0, "", 0]]],
    }
    assert list(heatmap.rows_of(gpus, NAMES, {}, FleetFilter(model="B200"))["a/n1"][4]) == [[1, 7, 0, "", 0]]
    assert heatmap.rows_of(gpus, NAMES, {}, FleetFilter(state="tainted")).keys() == {"a/n1"}
    labels = {(2, "m"): {"team": "x"}}
    assert heatmap.rows_of(gpus, NAMES, labels, FleetFilter(label="team=x")).keys() == {"b/m"}


@pytest.mark.parametrize(
    ("used", "flags", "unavailable"),
    [
        (0, heatmap.TAINTED, True),  # an idle tainted GPU cannot be allocated
        (3, heatmap.TAINTED, True),  # its idle partitions neither
        (7, heatmap.TAINTED | heatmap.RESERVED, False),  # wholly in use: tainted, but nothing idle
        (2, heatmap.UNAVAILABLE, True),  # partitions blocked by the counters of the allocated ones
        (0, 0, False),
    ],
)
def test_the_unavailable_filter_follows_the_counts_definition(used, flags, unavailable):
    assert heatmap.cell_in_state(used, flags, "unavailable") is unavailable
