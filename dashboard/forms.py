"""Settings forms: validate input, then the views call the services; a service's refusal lands on the field
it names."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

from django import forms

from carbon import co2e
from carbon.models import ContractualInstrument
from tenancy.models import Site


def within_years(value: date) -> None:
    """The years every stored date keeps to (co2e.FIRST_YEAR-LAST_YEAR), as for the API and the services."""
    problem = co2e.year_problem(value, "the date")
    if problem:
        raise forms.ValidationError(problem)


class SiteForm(forms.Form):
    name = forms.SlugField(max_length=64)
    zone = forms.CharField(max_length=32, help_text="grid zone, e.g. FR, DE, US-CA")
    pue = forms.DecimalField(
        min_value=Decimal(1), max_value=Decimal(5), max_digits=5, decimal_places=3, initial=Decimal("1.2")
    )
    pue_source = forms.ChoiceField(choices=[("declared", "declared"), ("measured", "measured")])
    pue_relative_uncertainty = forms.DecimalField(
        min_value=Decimal(0),
        max_value=Decimal("0.99"),
        max_digits=6,
        decimal_places=4,
        initial=Decimal("0.05"),
    )
    electricity = forms.ChoiceField(choices=Site.Electricity.choices)


class DeviceForm(forms.Form):
    device_id = forms.CharField(widget=forms.HiddenInput)
    site = forms.ModelChoiceField(queryset=Site.objects.none(), required=False)
    embodied_kg_co2e = forms.DecimalField(
        min_value=Decimal(0), max_digits=12, decimal_places=3, required=False
    )
    lifetime_years = forms.DecimalField(
        min_value=Decimal("0.01"), max_digits=6, decimal_places=2, required=False
    )

    def __init__(self, *args: object, organization_id: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["site"].queryset = Site.objects.filter(organization_id=organization_id)  # type: ignore[attr-defined]


class ApiKeyForm(forms.Form):
    name = forms.CharField(max_length=100, required=False)
    scopes = forms.MultipleChoiceField(
        choices=[("infer", "infer"), ("read", "read"), ("admin", "admin")],
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
    instrument_id = forms.CharField(max_length=100)
    kind = forms.ChoiceField(choices=[(k, k) for k in ContractualInstrument.KINDS])
    zone = forms.CharField(max_length=32)
    vintage_start = forms.DateTimeField(help_text="UTC, on a whole hour, e.g. 2025-01-01 00:00")
    vintage_end = forms.DateTimeField(help_text="UTC, exclusive")
    mwh = forms.DecimalField(min_value=Decimal("0.000001"), max_digits=16, decimal_places=6, required=False)
    intensity_g_per_kwh = forms.DecimalField(
        min_value=Decimal(0), max_digits=12, decimal_places=6, initial=Decimal(0)
    )
    certificate_ids = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    retirement_evidence = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    criteria = forms.MultipleChoiceField(
        choices=CRITERIA, widget=forms.CheckboxSelectMultiple, required=False
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
        help_text="plain zone,datetime,g_co2e_per_kwh or an Electricity Maps hourly export"
    )
    source = forms.CharField(max_length=500, required=False)
    licence = forms.CharField(max_length=200, required=False)
    allow_new_zones = forms.BooleanField(required=False)


class ReportForm(forms.Form):
    start = forms.DateField(help_text="first day (YYYY-MM-DD)", validators=[within_years])
    end = forms.DateField(help_text="day after the last (exclusive)", validators=[within_years])


# The job submission form (the API's serializer checks the same fields).
class JobForm(forms.Form):
    file = forms.FileField(help_text="JSON Lines: one KServe v2 infer request body (JSON) per line")
    model = forms.CharField(max_length=128, help_text="a model of the model repository, e.g. linear")
    version = forms.CharField(max_length=32, required=False, help_text="empty: the latest ready version")
    deadline = forms.DateTimeField(help_text="UTC, e.g. 2026-12-04 18:00", validators=[within_years])
