"""Seeds of random tests kept as regressions: a seed that once failed runs in every later run.

A test parametrizes over ``[new seed, *kept(FILE)]`` and runs its body in ``keeping(FILE, seed)``, which
appends a new failing seed to FILE (one per line; text after the number is a comment).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def kept(path: Path) -> list[int]:
    """The seeds listed in ``path`` (none when it does not exist)."""
    if not path.exists():
        return []
    return [int(line.split()[0]) for line in path.read_text().splitlines() if line.strip()[:1].isdigit()]


@contextmanager
def keeping(path: Path, seed: int) -> Iterator[None]:
    """Run the body; if an assertion fails on a seed ``path`` does not list yet, append it and re-raise."""
    try:
        yield
    except AssertionError:
        if seed not in kept(path):
            with path.open("a") as out:
                out.write(f"{seed}\n")
        raise
