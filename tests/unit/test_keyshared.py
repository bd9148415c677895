"""Dicts sharing their key tables (claims.keyshared): the same dicts to every reader, in less memory."""

from __future__ import annotations

import copy
import json
import logging
import pickle
import tracemalloc
from typing import Any

import orjson
import pytest

from claims import keyshared as module
from claims.keyshared import keyshared

ATTRIBUTES = {
    "type": {"string": "mig"},
    "uuid": {"string": "MIG-0"},
    "brand": {"string": "Nvidia"},
    "profile": {"string": "1g.10gb"},
    "parentUUID": {"string": "GPU-0"},
    "productName": {"string": "NVIDIA H100 80GB HBM3"},
    "architecture": {"string": "Hopper"},
    "driverVersion": {"version": "580.95.5"},
    "cudaDriverVersion": {"version": "13.0.0"},
    "cudaComputeCapability": {"version": "9.0.0"},
    "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
    "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
}


def test_a_keyshared_dict_reads_serializes_and_copies_as_the_dict_it_was_made_of() -> None:
    made = keyshared(ATTRIBUTES)
    assert type(made) is dict and made == ATTRIBUTES and made is not ATTRIBUTES
    assert list(made.items()) == list(ATTRIBUTES.items())  # the order too
    assert orjson.dumps(made) == orjson.dumps(ATTRIBUTES)
    assert json.dumps(made) == json.dumps(ATTRIBUTES)
    assert pickle.loads(pickle.dumps(made)) == ATTRIBUTES == copy.deepcopy(made)
    # Another order of the same keys is another layout, kept in its own order.
    reordered = dict(reversed(list(ATTRIBUTES.items())))
    assert list(keyshared(reordered)) == list(reordered)


def test_a_keyshared_dict_may_still_be_changed() -> None:
    made = keyshared({"a": 1, "b": 2})
    made["c"] = 3
    del made["a"]
    made["b"] = 5
    assert made == {"b": 5, "c": 3} and list(made) == ["b", "c"]
    assert keyshared({"a": 1, "b": 2}) == {"a": 1, "b": 2}  # its layout's next dict is not affected


def test_dicts_of_one_layout_take_less_than_half_the_memory_of_plain_ones() -> None:
    # What the module is for: the keys and their hashes once per layout, not once per dict.
    def allocated(make: Any) -> int:
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            held = [make({**ATTRIBUTES, "uuid": i}) for i in range(2000)]
            size = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len(held) == 2000
        return size

    keyshared(ATTRIBUTES)  # the layout's class made beforehand
    assert allocated(keyshared) < allocated(dict) / 2


@pytest.mark.parametrize(
    "values",
    [
        {1: "a"},  # not a string key
        {f"k{i}": i for i in range(module.MAX_KEYS + 1)},  # longer than CPython shares
    ],
    ids=["int key", "too many keys"],
)
def test_a_dict_that_cannot_share_its_keys_is_returned_as_it_is(values: dict[Any, Any]) -> None:
    assert keyshared(values) is values


def test_past_the_limit_of_layouts_a_new_layout_is_a_plain_dict_and_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(module, "_classes", {})
    monkeypatch.setattr(module, "_said_full", False)
    monkeypatch.setattr(module, "MAX_LAYOUTS", 2)
    first, second, third, fourth = {"a": 1}, {"b": 1}, {"c": 1}, {"d": 1}
    assert keyshared(first) is not first and keyshared(second) is not second
    with caplog.at_level(logging.WARNING, logger="claims.keyshared"):
        assert keyshared(third) is third and keyshared(fourth) is fourth and module.layouts() == 2
    assert [r.getMessage() for r in caplog.records] == [
        "keyshared: 2 layouts of dict keys; a new layout is a plain dict"
    ]
    again = {"a": 2}
    assert keyshared(again) is not again and keyshared(again) == again  # known layouts still share
