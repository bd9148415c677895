"""A random test's failing seed is kept (tests/seeds.py): appended once, then listed for every later run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import seeds


def test_a_failing_seed_is_appended_once_and_a_passing_one_never(tmp_path: Path) -> None:
    path = tmp_path / "seeds.txt"
    path.write_text("# seeds that once failed\n7 a comment after the number\n")
    with seeds.keeping(path, 11):
        pass
    assert seeds.kept(path) == [7]
    for _ in range(2):
        with pytest.raises(AssertionError), seeds.keeping(path, 12):
            raise AssertionError("seed 12 fails")
    with pytest.raises(AssertionError), seeds.keeping(path, 7):
        raise AssertionError("a kept seed fails again")
    assert seeds.kept(path) == [7, 12]
    assert seeds.kept(tmp_path / "missing.txt") == []
