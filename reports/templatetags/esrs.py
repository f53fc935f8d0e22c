"""``{% load esrs %}``: ``{{ datapoint|esrs_value }}`` prints an ESRS datapoint's value through the one number
formatter (:func:`reports.esrs.show`)."""

from __future__ import annotations

from typing import Any

from django import template

from reports.esrs import show

register = template.Library()


@register.filter
def esrs_value(point: dict[str, Any]) -> str:
    return show(point)


@register.filter
def esrs_mwh(value: Any) -> str:
    """An energy given in MWh (a decimal string), through the one formatter."""
    return "n/a" if value in (None, "") else show({"value": str(value), "unit": "MWh"})
