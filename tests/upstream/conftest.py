"""Prints how the upstream allocator table fared: passes, skips and known differences, each counted apart."""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    counts: Counter[str] = Counter()
    outcomes = ("passed", "failed", "skipped", "xfailed", "xpassed", "error")
    for outcome in outcomes:
        for report in terminalreporter.stats.get(outcome, []):
            if "test_the_engine_allocates_like_upstream" in getattr(report, "nodeid", ""):
                counts[outcome] += 1
    if counts:
        terminalreporter.write_line(
            "upstream allocator table (v1.37.2): " + ", ".join(f"{counts[k]} {k}" for k in outcomes)
        )
