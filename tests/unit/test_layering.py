"""The layering import-linter cannot see: a model fetched through the app registry, and SQL text naming a
table. Either would let one app read another's tables without an import (pyproject's contracts)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.apps import apps

ROOT = Path(__file__).resolve().parents[2]
APPS = ("fleet", "claims", "usage", "dashboard", "simulator")
LIBRARIES = ("web",)


def _sources(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts)


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def _table_owners() -> dict[str, str]:
    return {
        model._meta.db_table: model._meta.app_label
        for model in apps.get_models()
        if model._meta.app_label in APPS
    }


def registry_lookups(package: str, tree: ast.AST) -> list[tuple[int, str]]:
    """``apps.get_model("other", ...)`` calls naming another app's model."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get_model"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value != package
        ):
            found.append((node.lineno, f"get_model({node.args[0].value!r}, ...)"))
    return found


def foreign_tables(package: str, tree: ast.AST, owners: dict[str, str]) -> list[tuple[int, str]]:
    """String literals naming a table another app owns (as a whole word: SQL text, not prose)."""
    pattern = re.compile(
        r"\b(" + "|".join(re.escape(t) for t in sorted(owners, key=len, reverse=True)) + r")\b"
    )
    found = []
    for line, text in _strings(tree):
        for table in pattern.findall(text):
            if owners[table] != package:
                found.append((line, f"{table} (owned by {owners[table]})"))
    return found


@pytest.mark.parametrize("package", APPS + LIBRARIES)
def test_no_app_reads_another_apps_tables_without_importing_it(package: str) -> None:
    owners = _table_owners()
    problems = []
    for path in _sources(package):
        tree = ast.parse(path.read_text(), str(path))
        for line, what in registry_lookups(package, tree) + foreign_tables(package, tree, owners):
            problems.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not problems, "\n".join(problems)


def test_the_checks_find_a_registry_lookup_and_a_foreign_table() -> None:
    tree = ast.parse(
        'apps.get_model("claims", "PendingCause")\nSQL = "SELECT 1 FROM claims_pendingcause WHERE x"\n'
    )
    assert registry_lookups("fleet", tree) == [(1, "get_model('claims', ...)")]
    assert foreign_tables("fleet", tree, _table_owners()) == [(2, "claims_pendingcause (owned by claims)")]
    assert foreign_tables("claims", tree, _table_owners()) == []
