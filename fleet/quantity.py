"""Kubernetes resource.Quantity parsing, exact.

Written by hand because no maintained PyPI package parses Quantities exactly (the kubernetes client's
``parse_quantity`` returns a Decimal and rounds nothing, but accepts forms the API server rejects and has no
canonical formatting). Values are ``fractions.Fraction`` so comparisons are exact, like the Go type.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
            "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
            "P": Fraction(10**15), "E": Fraction(10**18)}  # fmt: skip
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>\d+(?:\.\d*)?|\.\d+)"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<exp>[eE][+-]?\d+)|(?P<dec>[numkMGTPE]?))$"
)


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity."""


def parse_quantity(text: str | int | float) -> Fraction:
    """Parse ``"80Gi"``, ``"1.5"``, ``"500m"``, ``"1e3"`` into an exact Fraction."""
    if isinstance(text, bool):
        raise QuantityError(f"not a quantity: {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        return Fraction(str(text))
    if not isinstance(text, str):
        raise QuantityError(f"not a quantity: {text!r}")
    match = _QUANTITY.match(text.strip())
    if not match:
        raise QuantityError(f"not a quantity: {text!r}")
    value = Fraction(match["num"])
    if match["bin"]:
        value *= _BINARY[match["bin"]]
    elif match["exp"]:
        value *= Fraction(10) ** int(match["exp"][1:])
    else:
        value *= _DECIMAL[match["dec"] or ""]
    return -value if match["sign"] == "-" else value


def quantity_bytes(text: str | int | None) -> int | None:
    """A memory quantity as whole bytes (rounded up like Kubernetes' Value()), or None when absent/invalid."""
    if text is None:
        return None
    try:
        value = parse_quantity(text)
    except QuantityError:
        return None
    return -((-value.numerator) // value.denominator)


def format_bytes(value: int | None) -> str:
    """Human form with binary suffixes, e.g. 85899345920 -> '80Gi'."""
    if value is None:
        return "-"
    for suffix, size in reversed(_BINARY.items()):
        if value >= size and value % size == 0:
            return f"{value // size}{suffix}"
    for suffix, size in reversed(_BINARY.items()):
        if value >= size:
            return f"{value / size:.1f}{suffix}"
    return str(value)
