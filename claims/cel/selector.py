"""The DRA selector API: compile a selector once (parse, check, compile; cached), view a device, evaluate;
and the attributes and capacities a selector references (callers deduplicate evaluations by them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from claims.cel.checker import Checker
from claims.cel.errors import CelCompileError, CelRuntimeError, CheckError, EvalError, format_issue
from claims.cel.evaluator import Program, compile_node
from claims.cel.parser import Node, Parser
from claims.cel.types import BOOL, is_dyn
from claims.cel.values import EMPTY, DomainMap, type_name
from fleet.quantity import Quantity, SemverError, parse_quantity, parse_semver

_WHOLE = "*"


def _references(node: Node, out: set[tuple[str, str, str]], flags: dict[str, bool]) -> None:
    """Collect ``('attributes'|'capacity', domain, name)`` reads; flag anything not statically named."""
    path = _device_path(node)
    if path is not None:
        if len(path) == 3:
            out.add((path[0], path[1], path[2]))
            return
        flags["opaque"] = True
        return
    if node.kind == "ident" and node.value == "device":
        flags["opaque"] = True
    if (
        node.kind == "select"
        and node.target is not None
        and node.target.kind == "ident"
        and node.target.value == "device"
        and node.value in ("driver", "allowMultipleAllocations")
    ):
        return
    if node.kind == "has":
        sel = node.args[0]
        sel_path = _device_path(sel)
        if sel_path is not None and len(sel_path) == 3:
            out.add((sel_path[0], sel_path[1], sel_path[2]))
            return
    if node.target is not None:
        _references(node.target, out, flags)
    for arg in node.args:
        _references(arg, out, flags)


def _device_path(node: Node) -> tuple[str, ...] | None:
    """``device.attributes['d'].name`` → ('attributes', 'd', 'name'); partial paths are shorter."""
    steps: list[str] = []
    current: Node | None = node
    while current is not None and current.kind in ("select", "index"):
        if current.kind == "select":
            steps.append(current.value)
        else:
            key = current.args[0]
            if key.kind != "lit" or not isinstance(key.value, str):
                return None
            steps.append(key.value)
        current = current.target
    if current is None or current.kind != "ident" or current.value != "device" or not steps:
        return None
    steps.reverse()
    if steps[0] not in ("attributes", "capacity") or len(steps) > 3:
        return None
    return tuple(steps)


@dataclass(frozen=True)
class CompiledSelector:
    """A checked selector. ``references`` are the attributes/capacities it names; ``opaque`` is True when
    it also reads device data that cannot be named statically (whole maps, dynamic keys), in which case
    callers must not deduplicate evaluations by ``references``."""

    expression: str
    references: frozenset[tuple[str, str, str]]
    opaque: bool = False
    reads_driver: bool = False
    _program: Program | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class DeviceView:
    """The ``device`` variable: attributes/capacity keyed by domain then identifier, values converted
    (``version`` → Semver, capacities → Quantity). ``attribute_error`` is set when an attribute cannot be
    converted; every evaluation on such a device fails with it, as in ``DeviceMatches``."""

    driver: str
    attributes: Mapping[str, Mapping[str, object]]
    capacity: Mapping[str, Mapping[str, Quantity]]
    allow_multiple_allocations: bool = False
    attribute_error: str = ""

    def activation(self) -> dict[str, Any]:
        cached = self.__dict__.get("_activation")
        if cached is None:
            cached = {
                "device": {
                    "driver": self.driver,
                    "attributes": DomainMap(self.attributes),
                    "capacity": DomainMap(self.capacity),
                    "allowMultipleAllocations": self.allow_multiple_allocations,
                }
            }
            object.__setattr__(self, "_activation", cached)
        return cached

    def lookup(self, kind: str, domain: str, name: str) -> object:
        """The value of a reference, or ``MISSING``."""
        source = self.attributes if kind == "attributes" else self.capacity
        return source.get(domain, EMPTY).get(name, MISSING)


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def parse_qualified_name(name: str, driver: str) -> tuple[str, str]:
    """Split ``domain/id``; a bare identifier belongs to the driver's domain."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def _attribute_value(value: Mapping[str, Any]) -> object:
    # List values (KEP-6072, DRAListTypeAttributes) become CEL lists, as in the scheduler with the gate on.
    if "strings" in value:
        return [str(v) for v in value["strings"] or []]
    if "bools" in value:
        return [bool(v) for v in value["bools"] or []]
    if "ints" in value:
        return [int(v) for v in value["ints"] or []]
    if "versions" in value:
        try:
            return [parse_semver(str(v)) for v in value["versions"] or []]
        except SemverError as exc:
            raise ValueError(f"parse semantic version: {exc}") from None
    if "string" in value:
        return str(value["string"])
    if "bool" in value:
        return bool(value["bool"])
    if "int" in value:
        return int(value["int"])
    if "version" in value:
        try:
            return parse_semver(str(value["version"]))
        except SemverError as exc:
            raise ValueError(f"parse semantic version: {exc}") from None
    raise ValueError("unsupported attribute value")


def device_view(driver: str, device: Mapping[str, Any]) -> DeviceView:
    """Build the CEL view of a ``resource.k8s.io/v1`` Device dict published by ``driver``."""
    attributes: dict[str, dict[str, object]] = {}
    error = ""
    for name, raw in (device.get("attributes") or {}).items():
        domain, ident = parse_qualified_name(name, driver)
        try:
            attributes.setdefault(domain, {})[ident] = _attribute_value(raw or {})
        except ValueError as exc:
            error = error or f"attribute {name}: {exc}"
    capacity: dict[str, dict[str, Quantity]] = {}
    for name, raw in (device.get("capacity") or {}).items():
        domain, ident = parse_qualified_name(name, driver)
        capacity.setdefault(domain, {})[ident] = parse_quantity(str((raw or {}).get("value", "0")))
    return DeviceView(
        driver=driver,
        attributes=attributes,
        capacity=capacity,
        allow_multiple_allocations=bool(device.get("allowMultipleAllocations", False)),
        attribute_error=error,
    )


def _reads_driver(node: Node) -> bool:
    if (
        node.kind == "select"
        and node.value == "driver"
        and node.target is not None
        and node.target.kind == "ident"
        and node.target.value == "device"
    ):
        return True
    return any(_reads_driver(child) for child in ([node.target] if node.target else []) + node.args)


_MAX_LENGTH = 10 * 1024


@lru_cache(maxsize=4096)
def compile_selector(expression: str) -> CompiledSelector:
    """Parse and type-check like the scheduler (StoredExpressions env, DRAConsumableCapacity on).
    Raises CelCompileError with the apiserver's ``compilation failed: ERROR: <input>:L:C: ...`` text."""
    if len(expression) > _MAX_LENGTH:
        raise CelCompileError(expression, f"may not be longer than {_MAX_LENGTH}")
    try:
        ast = Parser(expression).parse()
        result_type = Checker().check(ast)
    except CheckError as exc:
        raise CelCompileError(
            expression, "compilation failed: " + format_issue(expression, exc.pos, exc.message)
        ) from None
    except RecursionError:
        raise CelCompileError(expression, "compilation failed: expression nesting too deep") from None
    if result_type != BOOL and not is_dyn(result_type):
        raise CelCompileError(expression, f"must evaluate to bool or the unknown type, not {result_type}")
    refs: set[tuple[str, str, str]] = set()
    flags = {"opaque": False}
    _references(ast, refs, flags)
    return CompiledSelector(
        expression=expression,
        references=frozenset(refs),
        opaque=flags["opaque"],
        reads_driver=_reads_driver(ast),
        _program=compile_node(ast),
    )


def evaluate(selector: CompiledSelector, device: DeviceView) -> bool:
    """Evaluate a selector for one device. Raises CelRuntimeError (e.g. ``no such key: memory``)."""
    if device.attribute_error:
        raise CelRuntimeError(selector.expression, device.attribute_error)
    program = selector._program
    assert program is not None
    try:
        result = program(device.activation())
    except EvalError as exc:
        raise CelRuntimeError(selector.expression, str(exc)) from None
    except RecursionError:
        raise CelRuntimeError(selector.expression, "expression nesting too deep") from None
    if not isinstance(result, bool):
        raise CelRuntimeError(
            selector.expression, f"CEL result of type {type_name(result)} could not be converted to bool"
        )
    return result
