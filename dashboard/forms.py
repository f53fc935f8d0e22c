"""Settings forms: validate input, then the views call the services; a service's refusal lands on the field
it names."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from django import forms
from django.utils import timezone

from carbon import co2e
from carbon.models import ContractualInstrument
from inference import limits
from tenancy.models import Site


def within_years(value: date) -> None:
    """The years every stored date keeps to (co2e.FIRST_YEAR-LAST_YEAR), as for the API and the services."""
    problem = co2e.year_problem(value, "the date")
    if problem:
        raise forms.ValidationError(problem)


class SiteForm(forms.Form):
    name = forms.SlugField(max_length=64, label="Name", help_text="letters, digits, - and _, e.g. paris-1")
    zone = forms.CharField(max_length=32, label="Grid zone", help_text="e.g. FR, DE, US-CA")
    pue = forms.DecimalField(
        min_value=Decimal(1),
        max_value=Decimal(5),
        max_digits=5,
        decimal_places=3,
        initial=Decimal("1.2"),
        label="PUE (facility energy / IT energy)",
        help_text="1 to 5, e.g. 1.2",
    )
    pue_source = forms.ChoiceField(
        choices=[("declared", "declared"), ("measured", "measured")], label="PUE source"
    )
    pue_relative_uncertainty = forms.DecimalField(
        min_value=Decimal(0),
        max_value=Decimal("0.99"),
        max_digits=6,
        decimal_places=4,
        initial=Decimal("0.05"),
        label="PUE uncertainty (fraction)",
        help_text="relative, 0 to 0.99: 0.05 is ±5 %",
    )
    electricity = forms.ChoiceField(choices=Site.Electricity.choices, label="Electricity")


class DeviceForm(forms.Form):
    device_id = forms.CharField(widget=forms.HiddenInput)
    site = forms.ModelChoiceField(
        queryset=Site.objects.none(), required=False, label="Site", empty_label="no site (not valued)"
    )
    embodied_kg_co2e = forms.DecimalField(
        min_value=Decimal(0),
        max_digits=12,
        decimal_places=3,
        required=False,
        label="Embodied emissions (kg CO2e)",
    )
    lifetime_years = forms.DecimalField(
        min_value=Decimal("0.01"),
        max_digits=6,
        decimal_places=2,
        required=False,
        label="Lifetime (years)",
    )

    def __init__(self, *args: object, organization_id: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["site"].queryset = Site.objects.filter(organization_id=organization_id)  # type: ignore[attr-defined]


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100, required=False, label="Name", help_text="what uses it, e.g. ci")
    scopes = forms.MultipleChoiceField(
        label="Scopes",
        choices=[
            ("infer", "infer: the gateway and job submission"),
            ("read", "read: the management API"),
            ("admin", "admin: changes through the API"),
        ],
        widget=forms.CheckboxSelectMultiple,
        initial=["infer", "read"],
    )


CRITERIA = (
    ("conveys_attributes", "conveys the emission rate attribute"),
    ("unique_claim", "the only instrument with this claim"),
    ("retired_for_reporter", "retired or cancelled for us"),
    ("vintage_matches_period", "vintage close to the period of use"),
    ("same_market", "from the market where we consume"),
    ("supplier_rate_disclosed", "supplier rate disclosed (supplier rates)"),
    ("residual_mix_adjusted", "claimed attributes removed from the residual mix"),
)


class InstrumentForm(forms.Form):
    instrument_id = forms.CharField(max_length=100, label="Instrument id")
    kind = forms.ChoiceField(choices=[(k, k) for k in ContractualInstrument.KINDS], label="Kind")
    zone = forms.CharField(
        max_length=32, label="Grid zone", help_text="where the energy was produced, e.g. FR"
    )
    vintage_start = forms.DateTimeField(
        label="Vintage start (UTC)", help_text="on a whole hour, e.g. 2025-01-01 00:00"
    )
    vintage_end = forms.DateTimeField(
        label="Vintage end (UTC, excluded)", help_text="at most a year after the start"
    )
    mwh = forms.DecimalField(
        min_value=Decimal("0.000001"),
        max_digits=16,
        decimal_places=6,
        required=False,
        label="Energy covered (MWh)",
        help_text="empty: unlimited (a supplier contract)",
    )
    intensity_g_per_kwh = forms.DecimalField(
        min_value=Decimal(0),
        max_digits=12,
        decimal_places=6,
        initial=Decimal(0),
        label="Emission rate (g CO2e/kWh)",
    )
    certificate_ids = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), label="Certificate ids"
    )
    retirement_evidence = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 2}), label="Retirement evidence"
    )
    criteria = forms.MultipleChoiceField(
        choices=CRITERIA, widget=forms.CheckboxSelectMultiple, required=False, label="Quality criteria met"
    )

    def clean_vintage_start(self) -> object:
        return _utc_within_years(self.cleaned_data["vintage_start"])

    def clean_vintage_end(self) -> object:
        return _utc_within_years(self.cleaned_data["vintage_end"])


def _utc_within_years(value: datetime) -> datetime:
    try:
        value = value.astimezone(UTC)
    except OverflowError:  # a date at datetime's very edge, moved past it by the zone
        raise forms.ValidationError(f"outside the years {co2e.FIRST_YEAR}-{co2e.LAST_YEAR}") from None
    within_years(value)
    return value


class FactorUploadForm(forms.Form):
    file = forms.FileField(
        label="CSV file",
        help_text="plain zone,datetime,g_co2e_per_kwh or an Electricity Maps hourly export",
    )
    source = forms.CharField(max_length=500, required=False, label="Source")
    licence = forms.CharField(max_length=200, required=False, label="Licence")
    allow_new_zones = forms.BooleanField(required=False, label="Allow grid zones not known yet")


PRESETS = (
    ("", "custom: the days below"),
    ("last_month", "last month"),
    ("last_quarter", "last quarter"),
    ("year_to_date", "year to date"),
    ("last_year", "last year"),
)


def preset_period(preset: str, today: date) -> tuple[date, date]:
    """The first and the last day (both included) of a preset period, seen from ``today`` (UTC)."""
    if preset == "last_month":
        end = today.replace(day=1) - timedelta(days=1)
        return end.replace(day=1), end
    if preset == "last_quarter":
        quarter_start = today.replace(month=(today.month - 1) // 3 * 3 + 1, day=1)
        end = quarter_start - timedelta(days=1)
        return end.replace(month=(end.month - 1) // 3 * 3 + 1, day=1), end
    if preset == "year_to_date":
        return today.replace(month=1, day=1), today
    if preset == "last_year":
        return date(today.year - 1, 1, 1), date(today.year - 1, 12, 31)
    raise ValueError(f"unknown preset {preset!r}")


class ReportForm(forms.Form):
    """A report's period as people give it: the first and the last day, both included (or a preset). The
    service and the API take the day after the last: ``cleaned_data["end_exclusive"]``."""

    preset = forms.ChoiceField(choices=PRESETS, required=False, label="Period")
    start = forms.DateField(
        required=False, label="First day", help_text="YYYY-MM-DD", validators=[within_years]
    )
    end = forms.DateField(
        required=False, label="Last day", help_text="YYYY-MM-DD, included", validators=[within_years]
    )

    def __init__(self, *args: Any, today: date | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.today = today if today is not None else timezone.now().astimezone(UTC).date()

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("preset"):
            data["start"], data["end"] = preset_period(data["preset"], self.today)
        else:
            for name, label in (("start", "first"), ("end", "last")):
                if data.get(name) is None and name not in self.errors:
                    self.add_error(name, f"give the {label} day of the period, or choose a preset")
            if self.errors:
                return data
            if data["end"] < data["start"]:
                self.add_error("end", f"the last day {data['end']} is before the first {data['start']}")
                return data
        last: date = data["end"]
        if last >= date(co2e.LAST_YEAR, 12, 31):
            self.add_error("end", f"the last day must be before {co2e.LAST_YEAR}-12-31")
            return data
        data["end_exclusive"] = last + timedelta(days=1)
        return data


class ResponsiblePersonForm(forms.Form):
    responsible_person = forms.CharField(
        max_length=limits.RESPONSIBLE_PERSON_MAX_LENGTH,
        required=False,
        label="Responsible person",
        help_text="named in every GHG report (ISO 14064-1, 9.3.1 b), e.g. name and role; empty: none named",
    )


# The job submission form (the API's serializer checks the same fields).
class JobForm(forms.Form):
    file = forms.FileField(help_text="JSON Lines: one KServe v2 infer request body (JSON) per line")
    model = forms.CharField(max_length=128, help_text="a model of the model repository, e.g. linear")
    version = forms.CharField(max_length=32, required=False, help_text="empty: the latest ready version")
    deadline = forms.DateTimeField(label="Deadline (UTC)", validators=[within_years])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # An example that is always ahead: tomorrow at 18:00 UTC.
        tomorrow = timezone.now().astimezone(UTC) + timedelta(days=1)
        self.fields["deadline"].help_text = f"e.g. {tomorrow:%Y-%m-%d} 18:00"


# The dashboard's range and filters (GET): presets or custom days, both included, as for the reports.
RANGE_PRESETS = (
    ("last_7_days", "last 7 days"),
    ("last_30_days", "last 30 days"),
    ("this_month", "this month"),
    ("last_month", "last month"),
    ("last_quarter", "last quarter"),
    ("year_to_date", "year to date"),
    ("last_year", "last year"),
    ("", "custom: the days below"),
)
DEFAULT_RANGE = "last_30_days"
RANGE_MAX_DAYS = 3660


def range_period(preset: str, today: date) -> tuple[date, date]:
    """The first and the last day (both included) of a range preset, seen from ``today`` (UTC)."""
    if preset == "last_7_days":
        return today - timedelta(days=6), today
    if preset == "last_30_days":
        return today - timedelta(days=29), today
    if preset == "this_month":
        return today.replace(day=1), today
    return preset_period(preset, today)


class RangeForm(forms.Form):
    """The range (a preset, or the first and the last day, both included) and the model and site filters
    that every chart and table of a dashboard page follows. ``cleaned_data["end_exclusive"]`` is the day
    after the last, as the selectors and the API take it."""

    preset = forms.ChoiceField(choices=RANGE_PRESETS, required=False, label="Range")
    start = forms.DateField(
        required=False,
        label="First day",
        validators=[within_years],
        widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"),
    )
    end = forms.DateField(
        required=False,
        label="Last day (included)",
        validators=[within_years],
        widget=forms.DateInput(attrs={"type": "date"}, format="%Y-%m-%d"),
    )
    model = forms.ChoiceField(required=False, label="Model")
    site = forms.TypedChoiceField(required=False, label="Site", coerce=int, empty_value=None)

    def __init__(
        self,
        data: Any,
        *,
        models: list[str],
        sites: list[tuple[int, str]],
        today: date | None = None,
    ) -> None:
        if not any(data.get(name) for name in ("preset", "start", "end", "model", "site")):
            data = {"preset": DEFAULT_RANGE}
        super().__init__(data)
        self.today = today if today is not None else timezone.now().astimezone(UTC).date()
        self.fields["model"].choices = [("", "all models"), *((m, m) for m in models)]
        self.fields["site"].choices = [("", "all sites"), *((str(pk), name) for pk, name in sites)]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("preset"):
            data["start"], data["end"] = range_period(data["preset"], self.today)
            # The date fields show the preset's days (typing in them makes the range custom again).
            self.data = self.data.copy()
            self.data["start"], self.data["end"] = data["start"].isoformat(), data["end"].isoformat()
        else:
            for name, label in (("start", "first"), ("end", "last")):
                if data.get(name) is None and name not in self.errors:
                    self.add_error(name, f"give the {label} day of the range, or choose a preset")
            if self.errors:
                return data
            if data["end"] < data["start"]:
                self.add_error("end", f"the last day {data['end']} is before the first {data['start']}")
                return data
            if (data["end"] - data["start"]).days >= RANGE_MAX_DAYS:
                self.add_error("end", f"a range holds at most {RANGE_MAX_DAYS} days")
                return data
        if data["end"] >= date(co2e.LAST_YEAR, 12, 31):
            self.add_error("end", f"the last day must be before {co2e.LAST_YEAR}-12-31")
            return data
        data["end_exclusive"] = data["end"] + timedelta(days=1)
        return data

    def period(self) -> tuple[date, date]:
        """The first day and the day after the last: the form's when valid, else the default range."""
        if self.is_valid():
            return self.cleaned_data["start"], self.cleaned_data["end_exclusive"]
        first, last = range_period(DEFAULT_RANGE, self.today)
        return first, last + timedelta(days=1)
