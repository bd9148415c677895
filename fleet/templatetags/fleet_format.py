"""Template filters for fleet figures: ``{% load fleet_format %}{{ n|binary_bytes }}``."""

from __future__ import annotations

from django import template

from fleet.quantity import format_bytes

register = template.Library()


@register.filter
def binary_bytes(value: int | None) -> str:
    """Bytes in binary units chosen by magnitude (:func:`fleet.quantity.format_bytes`): '634 GiB'."""
    return format_bytes(value)
