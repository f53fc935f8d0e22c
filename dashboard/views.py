"""Dashboard pages: validate, call a selector or service, render. Every page shows only the signed-in user's
organization; writes need the role that allows them (analyst: reports; admin: settings)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils import timezone
from django.utils.http import urlencode

from carbon import services as carbon
from carbon.model_stats import model_stats
from carbon.models import ContractualInstrument, FactorImport
from carbon.selectors import factor_attributions, instrument_summary
from dashboard import charts, forms, selectors
from dashboard.access import can, member, organization_id, render_page
from reports.models import Report, ReportFile, ReportingProfile
from reports.services import report_request, responsible_person_set
from tenancy.models import ApiKey, Device, Membership, Site
from tenancy.services import ServiceError, api_key_create, api_key_revoke


def _range(request: HttpRequest) -> tuple[forms.RangeForm, dict[str, Any]]:
    """The page's range and filters from the query (the default range when none or a bad one is given; the
    form then says what is wrong beside the field), and the query that carries them to the other pages."""
    org_id = organization_id(request)
    models, sites = selectors.filter_choices(org_id)
    form = forms.RangeForm(request.GET, models=models, sites=sites)
    first, end = form.period()
    valid = form.is_valid()
    model = (form.cleaned_data.get("model") or None) if valid else None
    site_id = form.cleaned_data.get("site") if valid else None
    kept = {k: request.GET[k] for k in ("preset", "start", "end", "model", "site") if request.GET.get(k)}
    if "preset" in request.GET and not request.GET["preset"]:
        kept["preset"] = ""
    return form, {
        "first": first,
        "end": end,
        "start_at": datetime(first.year, first.month, first.day, tzinfo=UTC),
        "end_at": datetime(end.year, end.month, end.day, tzinfo=UTC),
        "model": model,
        "site_id": site_id,
        "site": Site.objects.filter(pk=site_id).first() if site_id is not None else None,
        "query": "?" + urlencode(kept) if valid and kept else "",
    }


@member
def overview(request: HttpRequest) -> HttpResponse:
    form, rng = _range(request)
    data = selectors.overview(
        organization_id(request),
        timezone.now(),
        rng["start_at"],
        rng["end_at"],
        model=rng["model"],
        site_id=rng["site_id"],
    )
    energy_chart = charts.chart(
        "energy",
        "Energy per day",
        data["daily_labels"],
        [("request energy", data["daily_request_kwh"]), ("idle energy", data["daily_idle_kwh"])],
        quantity="energy_kwh",
        stacked=True,
    )
    carbon_chart = charts.chart(
        "emissions",
        "Emissions per day, CO2e",
        data["daily_labels"],
        [("location-based", data["daily_location_g"]), ("market-based", data["daily_market_g"])],
        quantity="mass_g",
    )
    template = "dashboard/_overview_live.html" if request.GET.get("partial") else "dashboard/overview.html"
    return render_page(
        request,
        template,
        "overview",
        data=data,
        energy_chart=energy_chart,
        carbon_chart=carbon_chart,
        range_form=form,
        range=rng,
        range_query=rng["query"],
    )


@member
def models_page(request: HttpRequest) -> HttpResponse:
    stats = model_stats(organization_id(request))
    batch_charts = {}
    for i, (model, sizes) in enumerate(stats["batch_sizes"].items()):
        # Every size from 1 to the largest seen, so one size alone still reads as a histogram.
        every = range(1, max(sizes) + 1) if sizes else range(0)
        batch_charts[model] = charts.chart(
            f"batches-{i}",
            f"{model}: batches by size, last hour of traffic",
            [str(size) for size in every],
            [("batches", [sizes.get(size, 0) for size in every])],
            quantity="batches",
            stacked=True,  # drawn as bars
            x_title="Batch size (requests)",
        )
    return render_page(request, "dashboard/models.html", "models", stats=stats, batch_charts=batch_charts)


@member
def energy_page(request: HttpRequest) -> HttpResponse:
    form, rng = _range(request)
    devices = selectors.device_timelines(
        organization_id(request), rng["start_at"], rng["end_at"], model=rng["model"], site_id=rng["site_id"]
    )
    step = "Hour (UTC)" if rng["end_at"] - rng["start_at"] <= timedelta(days=14) else "Day (UTC)"
    for i, d in enumerate(devices):
        d["chart"] = charts.chart(
            f"device-{i}",
            f"{d['device_id']}: batch and idle energy",
            d["labels"],
            [("batch energy", d["busy"]), ("idle energy", d["idle"])],
            quantity="energy_kwh",
            stacked=True,
            x_title=step,
        )
    return render_page(
        request,
        "dashboard/energy.html",
        "energy",
        devices=devices,
        range_form=form,
        range=rng,
        range_query=rng["query"],
    )


@member
def carbon_page(request: HttpRequest) -> HttpResponse:
    form, rng = _range(request)
    data = selectors.carbon_page(
        organization_id(request), rng["start_at"], rng["end_at"], model=rng["model"], site_id=rng["site_id"]
    )
    step = "Hour (UTC)" if rng["end_at"] - rng["start_at"] <= timedelta(days=14) else "Day (UTC)"
    for i, entry in enumerate(data["sites"]):
        name = entry["site"].name if entry["site"] is not None else "(no site)"
        entry["chart"] = charts.chart(
            f"intensity-{i}",
            f"{name}: grid intensity, location-based",
            entry["hours"],
            [("g CO2e per facility kWh", entry["intensity"])],
            quantity="g/kWh",
            x_title=step,
        )
    return render_page(
        request,
        "dashboard/carbon.html",
        "carbon",
        data=data,
        range_form=form,
        range=rng,
        range_query=rng["query"],
    )


@member
def reports_page(request: HttpRequest) -> HttpResponse:
    form = forms.ReportForm(request.POST or None)
    if request.method == "POST":
        if not can(request, "report"):
            raise PermissionDenied("requesting reports needs the analyst or admin role")
        if form.is_valid():
            try:
                report = report_request(
                    organization=request.membership.organization,  # type: ignore[attr-defined]
                    start=form.cleaned_data["start"],
                    end=form.cleaned_data["end_exclusive"],  # the form's last day is included
                    requested_by=f"user:{request.user}",
                )
            except ServiceError as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Report {report.pk} requested.")
                return HttpResponseRedirect("/dashboard/reports")
    files = Prefetch("files", queryset=ReportFile.objects.defer("content").order_by("format"))
    reports = (
        Report.objects.filter(organization_id=organization_id(request))
        .defer("snapshot")
        .prefetch_related(files)[:50]
    )
    return render_page(request, "dashboard/reports.html", "reports", form=form, reports=reports)


SETTINGS_SECTIONS = (
    ("organization", "Organization"),
    ("sites", "Sites"),
    ("devices", "Devices"),
    ("keys", "API keys"),
    ("instruments", "Instruments"),
    ("imports", "Factor imports"),
)
# The sub-page each form belongs to: a refused form is shown again there, its errors beside its fields.
ACTION_SECTION = {
    "profile": "organization",
    "site": "sites",
    "device": "devices",
    "key": "keys",
    "revoke": "keys",
    "instrument": "instruments",
    "upload": "imports",
}
# The keys the job runner makes for one run each ("job 12 run 1"): folded away under the others.
JOB_KEY = re.compile(r"job \d+ run \d+")


@member
def settings_page(request: HttpRequest, section: str = "organization") -> HttpResponse:
    org_id = organization_id(request)
    org = request.membership.organization  # type: ignore[attr-defined]
    action = request.POST.get("action") if request.method == "POST" else None
    section = ACTION_SECTION.get(action or "", section)
    done = f"/dashboard/settings/{section}"
    if action and not can(request, "admin"):
        raise PermissionDenied("changing settings needs the admin role")
    site_form = forms.SiteForm(request.POST if action == "site" else None, prefix="site")
    key_form = forms.ApiKeyForm(request.POST if action == "key" else None, prefix="key")
    instrument_form = forms.InstrumentForm(
        request.POST if action == "instrument" else None, prefix="instrument"
    )
    profile = ReportingProfile.objects.filter(organization_id=org_id).first()
    profile_form = forms.ResponsiblePersonForm(
        request.POST if action == "profile" else None,
        prefix="profile",
        initial={"responsible_person": profile.responsible_person if profile else ""},
    )
    upload_form = forms.FactorUploadForm(
        request.POST if action == "upload" else None,
        request.FILES if action == "upload" else None,
        prefix="upload",
    )
    new_key = None
    upload_result = None
    if action == "site" and site_form.is_valid():
        try:
            carbon.site_create(organization=org, **site_form.cleaned_data)
            messages.success(request, f"Site {site_form.cleaned_data['name']} created.")
            return HttpResponseRedirect(done)
        except ServiceError as exc:
            _error(site_form, exc, ("zone", "name", "pue"))
    elif action == "profile" and profile_form.is_valid():
        try:
            responsible_person_set(
                organization=org, responsible_person=profile_form.cleaned_data["responsible_person"]
            )
        except ServiceError as exc:
            profile_form.add_error("responsible_person", str(exc))
        else:
            messages.success(request, "Responsible person saved.")
            return HttpResponseRedirect(done)
    elif action == "key" and key_form.is_valid():
        created = api_key_create(
            organization=org, scopes=key_form.cleaned_data["scopes"], name=key_form.cleaned_data["name"]
        )
        new_key = created.raw_key
    elif action == "revoke":
        key = ApiKey.objects.filter(organization_id=org_id, prefix=request.POST.get("prefix", "")).first()
        if key is not None:
            api_key_revoke(api_key=key)
            messages.success(request, f"Key {key.prefix} revoked.")
        return HttpResponseRedirect(done)
    elif action == "instrument" and instrument_form.is_valid():
        data = dict(instrument_form.cleaned_data)
        chosen = set(data.pop("criteria"))
        criteria = {key: key in chosen for key, _ in forms.CRITERIA}
        try:
            carbon.instrument_create(
                organization=org, quality_criteria=criteria, created_by=str(request.user), **data
            )
            messages.success(request, f"Instrument {data['instrument_id']} recorded.")
            return HttpResponseRedirect(done)
        except ServiceError as exc:
            _error(instrument_form, exc, ("vintage_start", "vintage_end", "mwh", "instrument_id", "zone"))
    elif action == "upload" and upload_form.is_valid():
        upload = upload_form.cleaned_data["file"]
        try:
            upload_result = carbon.factor_import_csv(
                data=upload.read(),
                name=upload.name,
                organization=org,
                created_by=str(request.user),
                source=upload_form.cleaned_data["source"] or None,
                licence=upload_form.cleaned_data["licence"] or None,
                allow_new_zones=upload_form.cleaned_data["allow_new_zones"],
            )
        except ServiceError as exc:
            upload_form.add_error("file", str(exc))
        else:
            if upload_result.status != FactorImport.Status.ACCEPTED:
                shown, count = carbon.import_errors(upload_result)
                listed = "; the first ones are listed below" if len(shown) < count else ""
                upload_form.add_error("file", f"{count} row(s) rejected; nothing was imported{listed}")
    elif action == "device":
        device = Device.objects.filter(
            site__organization_id=org_id, device_id=request.POST.get("device_id", "")
        ).first()
        device_form = forms.DeviceForm(request.POST, organization_id=org_id)
        if device is not None and device_form.is_valid():
            try:
                carbon.device_update(
                    device=device,
                    site=device_form.cleaned_data["site"],
                    embodied_kg_co2e=device_form.cleaned_data["embodied_kg_co2e"],
                    lifetime_years=device_form.cleaned_data["lifetime_years"],
                )
                messages.success(request, f"Device {device.device_id} updated.")
            except ServiceError as exc:
                messages.error(request, str(exc))
        else:
            messages.error(
                request,
                "device update rejected: "
                + "; ".join(f"{k}: {' '.join(v)}" for k, v in device_form.errors.items())
                if device is not None
                else "no such device in your organization",
            )
        return HttpResponseRedirect(done)
    devices = Device.objects.filter(site__organization_id=org_id).select_related("site")
    keys = list(ApiKey.objects.filter(organization_id=org_id))
    return render_page(
        request,
        "dashboard/settings.html",
        "settings",
        section=section,
        sections=SETTINGS_SECTIONS,
        job_keys=[k for k in keys if JOB_KEY.fullmatch(k.name)],
        sites=Site.objects.filter(organization_id=org_id).prefetch_related("pue_records"),
        devices=[
            (
                d,
                forms.DeviceForm(
                    initial={
                        "device_id": d.device_id,
                        "site": d.site_id,
                        "embodied_kg_co2e": d.embodied_kg_co2e,
                        "lifetime_years": d.lifetime_years,
                    },
                    organization_id=org_id,
                    auto_id=f"id_device{n}_%s",
                ),
            )
            for n, d in enumerate(devices)
        ],
        keys=[k for k in keys if not JOB_KEY.fullmatch(k.name)],
        instruments=carbon_instruments(org_id),
        imports=FactorImport.objects.filter(organization_id=org_id)[:20],
        site_form=site_form,
        key_form=key_form,
        instrument_form=instrument_form,
        upload_form=upload_form,
        profile_form=profile_form,
        upload_result=upload_result,
        new_key=new_key,
    )


def carbon_instruments(org_id: int) -> list[dict[str, Any]]:
    return [instrument_summary(i) for i in ContractualInstrument.objects.filter(organization_id=org_id)]


def _error(form: Any, exc: ServiceError, fields: tuple[str, ...]) -> None:
    """Put a service's refusal next to the field its message names, else on the form."""
    message = str(exc)
    for name in fields:
        if name in message or name.split("_")[0] in message:
            form.add_error(name, message)
            return
    form.add_error(None, message)


def home(request: HttpRequest) -> HttpResponse:
    """Signed-in users go to the overview; a visitor sees how to log in and where the API docs are (never a
    path of the server)."""
    if request.user.is_authenticated:
        return HttpResponseRedirect("/dashboard/")
    return render(request, "home.html", {"attributions": factor_attributions()})


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """The 404 page in the product's layout, with the dashboard's navigation for a member."""
    context: dict[str, Any] = {"page": "not found"}
    if request.user.is_authenticated:
        membership = Membership.objects.select_related("organization").filter(user=request.user).first()
        if membership is not None:
            context.update(org=membership.organization, role=membership.role)
    return render(request, "404.html", context, status=404)
