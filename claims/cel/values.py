"""CEL runtime values (uint, optional, domain maps), cel-go's equality and ordering across types, and the
runtime library: the functions a selector calls (strings, lists, regex, quantity, semver).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, NoReturn

from claims.cel.errors import EvalError
from claims.cel.types import CelType
from fleet.quantity import Quantity, QuantityError, Semver, SemverError, parse_quantity, parse_semver


class Uint(int):
    """A CEL ``uint`` value (Python has one integer type)."""


class Optional_:
    """A CEL ``optional_type`` value."""

    __slots__ = ("value",)
    _NONE: Optional_

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def has_value(self) -> bool:
        return self is not Optional_._NONE

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Optional_):
            return False
        if not self.has_value() or not other.has_value():
            return self.has_value() == other.has_value()
        return cel_equal(self.value, other.value)

    __hash__ = None  # type: ignore[assignment]


Optional_._NONE = Optional_()


class DomainMap(dict[str, Any]):
    """``device.attributes`` / ``device.capacity``: an unknown domain reads as an empty map."""


EMPTY: Mapping[str, Any] = {}


def type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Uint):
        return "uint"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if value is None:
        return "null_type"
    if isinstance(value, list):
        return "list"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, Quantity):
        return "kubernetes.Quantity"
    if isinstance(value, Semver):
        return "kubernetes.Semver"
    if isinstance(value, Optional_):
        return "optional_type"
    if isinstance(value, CelType):
        return "type"
    return type(value).__name__


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def cel_equal(a: Any, b: Any) -> bool:
    """Heterogeneous equality (cel-go): different kinds are unequal; numbers compare by value."""
    if is_number(a) and is_number(b):
        return bool(a == b)
    if type_name(a) != type_name(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping):
        return len(a) == len(b) and all(k in b and cel_equal(v, b[k]) for k, v in a.items())
    return bool(a == b)


def no_overload(fn: str, *args: Any) -> NoReturn:
    raise EvalError(f"no such overload: {fn}({', '.join(type_name(a) for a in args)})")


def compare_values(a: Any, b: Any, fn: str) -> int:
    if is_number(a) and is_number(b):
        return (a > b) - (a < b)
    if type(a) is type(b) and isinstance(a, str | bytes | bool):
        return (a > b) - (a < b)
    no_overload(fn, a, b)


def _regex(pattern: str) -> re.Pattern[str]:
    try:
        return _compile_re2(pattern)
    except re.error as exc:
        raise EvalError(f"invalid regular expression: {exc}") from None


@lru_cache(maxsize=256)
def _compile_re2(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _quantity(text: Any) -> Quantity:
    try:
        return parse_quantity(text)
    except QuantityError as exc:
        raise EvalError(str(exc)) from None


def _semver(text: Any, normalize: Any = False) -> Semver:
    try:
        return parse_semver(text, bool(normalize))
    except SemverError as exc:
        raise EvalError(str(exc)) from None


def _is_ok(fn: Callable[..., Any], *args: Any) -> bool:
    try:
        fn(*args)
    except EvalError:
        return False
    return True


def _ordered(a: Any, b: Any, fn: str) -> int:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.compare(b)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return a.compare(b)
    no_overload(fn, a, b)


def _as_integer(q: Quantity) -> int:
    try:
        return q.as_integer()
    except QuantityError as exc:
        raise EvalError(str(exc)) from None


def _index_of(s: Any, sub: Any, offset: int = 0) -> int:
    if isinstance(s, list):
        for index, item in enumerate(s):
            if cel_equal(item, sub):
                return index
        return -1
    if offset < 0 or offset > len(s):
        raise EvalError(f"index out of range: {offset}")
    return int(s.find(sub, offset))


def _last_index_of(s: Any, sub: Any, offset: int | None = None) -> int:
    if isinstance(s, list):
        for index in range(len(s) - 1, -1, -1):
            if cel_equal(s[index], sub):
                return index
        return -1
    if offset is None:
        return int(s.rfind(sub))
    if offset < 0 or offset >= len(s) + (1 if not s else 0):
        raise EvalError(f"index out of range: {offset}")
    return int(s.rfind(sub, 0, offset + len(sub)))


def _substring(s: str, start: int, end: int | None = None) -> str:
    end = len(s) if end is None else end
    if start < 0 or start > len(s):
        raise EvalError(f"index out of range: {start}")
    if end < start or end > len(s):
        raise EvalError(f"index out of range: {end}")
    return s[start:end]


def _split(s: str, sep: str, limit: int = -1) -> list[str]:
    if limit == 0:
        return []
    if sep == "":
        chars = list(s)
        return (
            chars if limit < 0 or limit >= len(chars) else [*chars[: limit - 1], "".join(chars[limit - 1 :])]
        )
    return s.split(sep) if limit < 0 else s.split(sep, limit - 1)


def _agg(items: list[Any], fn: str) -> Any:
    if fn == "sum":
        total: Any = 0
        for item in items:
            total = total + item
        return total
    if not items:
        raise EvalError(f"{fn} called on empty list")
    best = items[0]
    for item in items[1:]:
        cmp = compare_values(item, best, fn)
        if (fn == "min" and cmp < 0) or (fn == "max" and cmp > 0):
            best = item
    return best


def _is_sorted(items: list[Any]) -> bool:
    return all(compare_values(items[i], items[i + 1], "isSorted") <= 0 for i in range(len(items) - 1))


def _zero(value: Any) -> bool:
    return value in (0, "", b"", None, False) or (isinstance(value, list | Mapping) and not value)


def _opt_value(o: Optional_) -> Any:
    if not o.has_value():
        raise EvalError("optional.none() dereference")
    return o.value


def _size(value: Any) -> int:
    if isinstance(value, str | bytes | list | Mapping):
        return len(value)
    no_overload("size", value)


def _to_int(value: Any) -> int:
    try:
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                raise EvalError("int overflow")
            return int(value)
        return int(value, 10) if isinstance(value, str) else int(value)
    except ValueError as exc:
        raise EvalError(f"cannot convert to int: {exc}") from None


def to_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode("utf-8")
    return str(value)


def _quote(s: str) -> str:
    out = (
        s.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\t", "\\t")
        .replace("\r", "\\r")
    )
    return f'"{out}"'


# name -> implementation taking (receiver, *args) for members or (*args) for globals
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "size": _size,
    "contains": lambda s, sub: sub in s,
    "startsWith": lambda s, p: s.startswith(p),
    "endsWith": lambda s, p: s.endswith(p),
    "matches": lambda s, p: _regex(p).search(s) is not None,
    "int": _to_int,
    "uint": lambda v: Uint(_to_int(v)),
    "double": float,
    "string": to_string,
    "bool": lambda v: v if isinstance(v, bool) else {"true": True, "false": False}[v],
    "bytes": lambda v: v.encode("utf-8"),
    "dyn": lambda v: v,
    "type": lambda v: CelType(type_name(v)),
    "quantity": _quantity,
    "isQuantity": lambda s: _is_ok(_quantity, s),
    "isInteger": lambda q: q.is_integer(),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda q: q.as_float(),
    "sign": lambda q: q.sign(),
    "add": lambda q, o: q.add(o),
    "sub": lambda q, o: q.sub(o),
    "semver": _semver,
    "isSemver": lambda s, n=False: _is_ok(_semver, s, n),
    "major": lambda v: v.major,
    "minor": lambda v: v.minor,
    "patch": lambda v: v.patch,
    "isGreaterThan": lambda a, b: _ordered(a, b, "isGreaterThan") > 0,
    "isLessThan": lambda a, b: _ordered(a, b, "isLessThan") < 0,
    "compareTo": lambda a, b: _ordered(a, b, "compareTo"),
    "charAt": lambda s, i: s[i] if 0 <= i < len(s) else ("" if i == len(s) else _substring(s, i, i)),
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "lowerAscii": lambda s: "".join(c.lower() if c.isascii() else c for c in s),
    "upperAscii": lambda s: "".join(c.upper() if c.isascii() else c for c in s),
    "trim": lambda s: s.strip(),
    "reverse": lambda s: s[::-1],
    "replace": lambda s, old, new, n=-1: s.replace(old, new, n),
    "split": _split,
    "substring": _substring,
    "join": lambda items, sep="": sep.join(items),
    "strings.quote": _quote,
    "find": lambda s, p: m.group() if (m := _regex(p).search(s)) else "",
    "findAll": lambda s, p, n=-1: [m.group() for m in _regex(p).finditer(s)][: n if n >= 0 else None],
    "isSorted": _is_sorted,
    "sum": lambda items: _agg(items, "sum"),
    "min": lambda items: _agg(items, "min"),
    "max": lambda items: _agg(items, "max"),
    "sets.contains": lambda a, b: all(any(cel_equal(x, y) for y in a) for x in b),
    "sets.equivalent": lambda a, b: (
        all(any(cel_equal(x, y) for y in b) for x in a) and all(any(cel_equal(x, y) for y in a) for x in b)
    ),
    "sets.intersects": lambda a, b: any(cel_equal(x, y) for x in a for y in b),
    "optional.of": Optional_,
    "optional.ofNonZeroValue": lambda v: Optional_._NONE if _zero(v) else Optional_(v),
    "optional.none": lambda: Optional_._NONE,
    "hasValue": lambda o: o.has_value(),
    "value": _opt_value,
    "orValue": lambda o, d: o.value if o.has_value() else d,
    "or": lambda o, other: o if o.has_value() else other,
}
