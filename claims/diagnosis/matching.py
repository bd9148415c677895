"""Selectors device by device: selector matches shared between devices with the same projection of the
attributes a selector reads, and which clause of a selector a device misses, in words.
"""

from __future__ import annotations

import re
from typing import Any

from claims.cel import (
    CelCompileError,
    CelRuntimeError,
    CompiledSelector,
    compile_selector,
    device_view,
    evaluate,
)
from claims.fleetstate import DeviceInfo, FleetState
from fleet.quantity import QuantityError, parse_quantity


def _raw_projection(info: DeviceInfo, selector: CompiledSelector) -> Any:
    """What ``selector`` reads from ``info.device`` in raw form; equal projections ⇒ equal results."""
    if selector.opaque:
        return ("device", info.key)
    driver = info.key[0]
    attrs = info.device.get("attributes") or {}
    caps = info.device.get("capacity") or {}
    values: list[Any] = [
        driver if selector.reads_driver else None,
        info.device.get("allowMultipleAllocations"),
    ]
    for kind, domain, name in sorted(selector.references):
        source = attrs if kind == "attributes" else caps
        raw = source.get(f"{domain}/{name}")
        if raw is None and domain == driver:
            raw = source.get(name)
        values.append(_hashable(raw))
    return tuple(values)


def _hashable(raw: Any) -> Any:
    """A raw attribute or capacity as a cache key (list-valued attributes hold lists)."""
    if isinstance(raw, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in raw.items()))
    if isinstance(raw, list):
        return tuple(_hashable(v) for v in raw)
    return raw


def selector_matches(state: FleetState, selector: CompiledSelector, info: DeviceInfo) -> bool:
    """Selector result for a device, shared across identical projections. Raises CelRuntimeError."""
    cache_key = (selector.expression, _raw_projection(info, selector))
    found = state.results.get(cache_key)
    if found is None:
        state.evaluations += 1
        try:
            found = evaluate(selector, device_view(info.key[0], info.device))
        except CelRuntimeError as exc:
            found = exc.message
        state.results[cache_key] = found
    else:
        state.saved += 1
    if isinstance(found, str):
        raise CelRuntimeError(selector.expression, found)
    return found


def split_conjuncts(expression: str) -> list[str]:
    """Top-level ``&&`` operands of a CEL expression (quotes and brackets respected)."""
    parts: list[str] = []
    depth, quote, start, i = 0, "", 0, 0
    while i < len(expression):
        ch = expression[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and expression.startswith("&&", i):
            parts.append(expression[start:i].strip())
            start = i + 2
            i += 1
        i += 1
    parts.append(expression[start:].strip())
    return [p for p in parts if p]


_QUANTITY_LITERAL = re.compile(r"quantity\(\s*['\"]([^'\"]+)['\"]\s*\)")


def _human_quantity(raw: str) -> str:
    try:
        value = parse_quantity(raw).value
    except QuantityError:
        return raw
    gib = value / (1 << 30)
    if value >= (1 << 30):
        return f"{float(gib):.0f}Gi" if gib.denominator == 1 or gib > 10 else f"{float(gib):.1f}Gi"
    return raw


def _raw_value(info: DeviceInfo, kind: str, domain: str, name: str) -> str | None:
    source = info.device.get(kind) or {}
    raw = source.get(f"{domain}/{name}")
    if raw is None and domain == info.key[0]:
        raw = source.get(name)
    if not isinstance(raw, dict):
        return None
    if kind == "capacity":
        return _human_quantity(str(raw.get("value", "")))
    return str(next(iter(raw.values()), ""))


_COMPARED = re.compile(r"""\.(\w+)\s*(==|!=|in)\s*('[^']*'|"[^"]*"|\[[^\]]*\])""")


def _wanted(clause: str, name: str) -> str:
    """What a clause compares attribute ``name`` with, as the miss states it: `` != '1g.10gb'`` or
    `` not in ['a', 'b']`` (the device's value alone, "profile '1g.10gb+me'", says nothing of the want)."""
    for attribute, op, literal in _COMPARED.findall(clause):
        if attribute == name:
            return {"==": f" != {literal}", "!=": f" == {literal}", "in": f" not in {literal}"}[op]
    return ""


def explain_miss(info: DeviceInfo, expression: str) -> tuple[str, str]:
    """(failing clause, values) for a device a request selector rejects, e.g. ("…", "memory 80Gi < 150Gi")."""
    for clause in split_conjuncts(expression):
        try:
            selector = compile_selector(clause)
            ok = evaluate(selector, device_view(info.key[0], info.device))
        except (CelCompileError, CelRuntimeError) as exc:
            return clause, exc.message
        if ok:
            continue
        values = []
        for kind, domain, name in sorted(selector.references):
            value = _raw_value(info, kind, domain, name)
            literal = _QUANTITY_LITERAL.search(clause)
            if kind == "capacity" and value is not None and literal:
                have = parse_quantity(
                    str((info.device.get("capacity") or {}).get(name, {}).get("value", "0"))
                )
                want = parse_quantity(literal.group(1))
                op = "<" if have.value < want.value else (">" if have.value > want.value else "=")
                values.append(f"{name} {value} {op} {_human_quantity(literal.group(1))}")
            elif value is None:
                values.append(f"{name} not published")
            else:
                values.append(f"{name} {value!r}{_wanted(clause, name)}")
        return clause, ", ".join(values) or "false"
    return expression, "false"
