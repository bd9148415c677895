"""Kubernetes ``resource.Quantity`` and ``blang/semver`` values, exact, in pure Python.

Quantities are kept as exact :class:`fractions.Fraction` values, so ``1Gi == 1024Mi`` and
``0.5 == 500m`` hold exactly, as in ``k8s.io/apimachinery/pkg/api/resource``. Like the Go code,
values more precise than nano units are rounded up to the next nano unit.

Written by hand: no maintained PyPI package parses quantities exactly as apimachinery does (the
kubernetes client's ``parse_quantity`` accepts forms the API server rejects and has no semver).

Not implemented (not needed for DRA devices): the canonical string form (``String()``) and the
int64/scale overflow limits of ``inf.Dec``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache, total_ordering

__all__ = [
    "Quantity",
    "QuantityError",
    "Semver",
    "SemverError",
    "format_bytes",
    "parse_quantity",
    "parse_semver",
    "quantity_bytes",
]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY_RE = re.compile(
    r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_NANO = Fraction(1, 10**9)
MAX_EXPONENT = 100
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


class QuantityError(ValueError):
    """A string is not a valid Kubernetes quantity."""


@total_ordering
@dataclass(frozen=True, eq=False)
class Quantity:
    """An exact Kubernetes quantity. ``original`` is the string it was parsed from, if any."""

    value: Fraction
    original: str = ""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(("quantity", self.value))

    def __repr__(self) -> str:
        return f"Quantity({self.original or str(self.value)!r})"

    def __str__(self) -> str:
        return self.original or str(self.value)

    def compare(self, other: Quantity) -> int:
        return (self.value > other.value) - (self.value < other.value)

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def is_integer(self) -> bool:
        """Whether ``asInteger()`` would succeed (an integral value that fits in int64)."""
        return self.value.denominator == 1 and _INT64_MIN <= self.value.numerator <= _INT64_MAX

    def as_integer(self) -> int:
        if not self.is_integer():
            raise QuantityError("cannot convert value to integer")
        return self.value.numerator

    def as_float(self) -> float:
        return float(self.value)

    def add(self, other: Quantity | int) -> Quantity:
        delta = other.value if isinstance(other, Quantity) else Fraction(other)
        return Quantity(self.value + delta)

    def sub(self, other: Quantity | int) -> Quantity:
        delta = other.value if isinstance(other, Quantity) else Fraction(other)
        return Quantity(self.value - delta)


@lru_cache(maxsize=65536)
def parse_quantity(text: str) -> Quantity:
    """Parse like ``resource.ParseQuantity``: ``<number><suffix>`` with binary (Ki..Ei), decimal
    (n, u, m, k, M, G, T, P, E) or exponent (``e3``/``E-2``) suffixes. Raises QuantityError.

    Cached: a fleet repeats a few hundred distinct strings millions of times, and Quantity is immutable."""
    if not isinstance(text, str):
        raise QuantityError(f"quantities must be strings, not {type(text).__name__}")
    match = _QUANTITY_RE.match(text)
    if not match:
        raise QuantityError(
            "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    number = Fraction(match.group("num"))
    suffix = match.group("suffix") or ""
    if suffix in _BINARY:
        number *= _BINARY[suffix]
    elif suffix in _DECIMAL:
        number *= Fraction(10) ** _DECIMAL[suffix]
    else:  # exponent form
        exponent = int(suffix[1:])
        if abs(exponent) > MAX_EXPONENT:
            # Fraction(10) ** 10_000_000 would take seconds of CPU: a cheap denial of service from a
            # pasted selector. apimachinery's own scale is an int32; no device capacity needs this.
            raise QuantityError(f"quantity exponent {exponent} is out of range (|e| <= {MAX_EXPONENT})")
        number *= Fraction(10) ** exponent
    if (number / _NANO).denominator != 1:
        # apimachinery rounds values more precise than nano units up (away from zero for +).
        number = Fraction(math.ceil(number / _NANO)) * _NANO
    return Quantity(number, text)


class SemverError(ValueError):
    """A string is not a valid semantic version."""


_SEMVER_RE = re.compile(
    r"^(?P<major>0|[1-9][0-9]*)\.(?P<minor>0|[1-9][0-9]*)\.(?P<patch>0|[1-9][0-9]*)"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+(?P<build>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


@dataclass(frozen=True, eq=False)
class Semver:
    """A semantic version as ``blang/semver`` v4 sees it. Equality ignores build metadata."""

    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    def _key(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.patch)

    def compare(self, other: Semver) -> int:
        if self._key() != other._key():
            return 1 if self._key() > other._key() else -1
        if self.pre == other.pre:
            return 0
        if not self.pre:
            return 1
        if not other.pre:
            return -1
        for mine, theirs in zip(self.pre, other.pre, strict=False):
            if mine == theirs:
                continue
            mine_num, theirs_num = mine.isdigit(), theirs.isdigit()
            if mine_num and theirs_num:
                return 1 if int(mine) > int(theirs) else -1
            if mine_num != theirs_num:
                return -1 if mine_num else 1
            return 1 if mine > theirs else -1
        return (len(self.pre) > len(other.pre)) - (len(self.pre) < len(other.pre))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self.compare(other) == 0

    def __hash__(self) -> int:
        return hash(("semver", self._key(), self.pre))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.pre:
            text += "-" + ".".join(self.pre)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __repr__(self) -> str:
        return f"Semver({str(self)!r})"


def parse_semver(text: str, normalize: bool = False) -> Semver:
    """Parse like ``semver.Parse`` (strict). With ``normalize`` (the CEL ``semver(s, true)`` form),
    a leading ``v`` is dropped, missing minor/patch become 0 and leading zeros are removed."""
    if not isinstance(text, str):
        raise SemverError("semver must be a string")
    if normalize:
        text = _normalize_semver(text)
    match = _SEMVER_RE.match(text)
    if not match:
        raise SemverError(f"invalid semantic version {text!r}")
    pre = tuple(match.group("pre").split(".")) if match.group("pre") else ()
    for part in pre:
        if part.isdigit() and len(part) > 1 and part.startswith("0"):
            raise SemverError(f"invalid semantic version {text!r}: numeric prerelease with leading zero")
    build = tuple(match.group("build").split(".")) if match.group("build") else ()
    return Semver(int(match.group("major")), int(match.group("minor")), int(match.group("patch")), pre, build)


def _normalize_semver(text: str) -> str:
    text = text.removeprefix("v")
    core, sep, rest = _split_core(text)
    parts = core.split(".")
    if len(parts) > 3 or not all(p.isdigit() for p in parts):
        return text
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(parts) + sep + rest


def _split_core(text: str) -> tuple[str, str, str]:
    for index, char in enumerate(text):
        if char in "-+":
            return text[:index], char, text[index + 1 :]
    return text, "", ""


def quantity_bytes(text: str | int | None) -> int | None:
    """A memory quantity as whole bytes (rounded up like Kubernetes' ``Value()``), or None."""
    if text is None or isinstance(text, bool):
        return None
    try:
        value = Fraction(text) if isinstance(text, int) else parse_quantity(text).value
    except QuantityError:
        return None
    return math.ceil(value)


def format_bytes(value: int | None) -> str:
    """Human form in binary units chosen by magnitude, e.g. 85899345920 -> '80 GiB', 3 TiB less a bit
    -> '2.8 TiB', 512 -> '512 B' (one decimal at most; every figure of a table in the same unit system)."""
    if value is None:
        return "-"
    for suffix, size in reversed(_BINARY.items()):
        if abs(value) >= size:
            text = f"{value / size:.1f}".removesuffix(".0")
            return f"{text} {suffix}B"
    return f"{value} B"
