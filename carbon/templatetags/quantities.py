"""Template filters over :mod:`carbon.display`, the one number formatter: ``{% load quantities %}``, then
``{{ value_g|mass_g }}``, ``{{ value_t|mass_t }}``, ``{{ value_g|mass_g_pm:uncertainty_g }}``, ``{{ kwh|energy_kwh }}``,
``{{ mwh|energy_mwh }}``, ``{{ j|energy_j }}``,
``{{ x|sig }}``, ``{{ n|count }}``, ``{{ fraction|percent }}``, ``{{ percent_value|percent_points }}``,
``{{ start|period:end_exclusive }}``, ``{{ day|day }}``.

The report templates and the dashboard's both load it, so a figure reads the same in a PDF and on a page. An
empty value (None, "") prints as "n/a"; a value that is not a number is a bug and raises.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from django import template

from carbon import display

register = template.Library()

MISSING = "n/a"


def _empty(value: Any) -> bool:
    return value is None or value == ""


@register.filter
def mass_g(value: Any) -> str:
    return MISSING if _empty(value) else display.mass_g(value)


@register.filter
def mass_t(value: Any) -> str:
    return MISSING if _empty(value) else display.mass_t(value)


@register.filter
def mass_g_pm(value: Any, uncertainty: Any) -> str:
    if _empty(value):
        return MISSING
    if _empty(uncertainty):
        return display.mass_g(value)
    return display.mass_g_pm(value, uncertainty)


@register.filter
def energy_kwh(value: Any) -> str:
    return MISSING if _empty(value) else display.energy_kwh(value)


@register.filter
def energy_mwh(value: Any) -> str:
    return MISSING if _empty(value) else display.energy_mwh(value)


@register.filter
def energy_j(value: Any) -> str:
    return MISSING if _empty(value) else display.energy_j(value)


@register.filter
def sig(value: Any) -> str:
    return MISSING if _empty(value) else display.number(value)


@register.filter
def count(value: Any) -> str:
    return MISSING if _empty(value) else display.count(int(value))


@register.filter
def percent(value: Any) -> str:
    return MISSING if _empty(value) else display.percent(value)


@register.filter
def percent_points(value: Any) -> str:
    return MISSING if _empty(value) else display.percent_points(value)


def _date(value: Any) -> date:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    return date.fromisoformat(str(value))


@register.filter
def period(start: Any, end_exclusive: Any) -> str:
    """A period from its first day and the day after its last (dates or ISO strings), both days printed."""
    return display.period(_date(start), _date(end_exclusive))


@register.filter
def day(value: Any) -> str:
    return MISSING if _empty(value) else display.day(_date(value))
