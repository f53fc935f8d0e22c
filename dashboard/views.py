"""Dashboard pages: validate, call a selector or service, render. Every page shows only the signed-in user's
organization; writes need the role that allows them (analyst: reports; admin: settings)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.utils import timezone

from carbon import services as carbon
from carbon.model_stats import last_traffic_ns, model_stats
from carbon.models import ContractualInstrument, FactorImport
from carbon.selectors import factor_attributions, instrument_summary
from dashboard import charts, forms, selectors
from dashboard.access import can, member, organization_id, render_page
from reports.models import Report, ReportFile
from reports.services import report_request
from tenancy.models import ApiKey, Device, Site
from tenancy.services import ServiceError, api_key_create, api_key_revoke


@member
def overview(request: HttpRequest) -> HttpResponse:
    data = selectors.overview(organization_id(request), timezone.now())
    energy_chart = charts.bar_chart(
        data["daily_labels"],
        [
            (
                "request energy",
                [t - i for t, i in zip(data["daily_energy_kwh"], data["daily_idle_kwh"], strict=True)],
            ),
            ("idle energy", data["daily_idle_kwh"]),
        ],
        unit="kWh",
        stacked=True,
    )
    carbon_chart = charts.bar_chart(
        data["daily_labels"],
        [("location-based", data["daily_location_kg"]), ("market-based", data["daily_market_kg"])],
        unit="kg CO2e",
    )
    template = "dashboard/_overview_live.html" if request.GET.get("partial") else "dashboard/overview.html"
    return render_page(
        request, template, "overview", data=data, energy_chart=energy_chart, carbon_chart=carbon_chart
    )


@member
def models_page(request: HttpRequest) -> HttpResponse:
    stats = model_stats(organization_id(request))
    batch_charts = {
        model: charts.bar_chart(
            [str(size) for size in sizes],
            [("batches", [float(n) for n in sizes.values()])],
            unit="batches",
            height=160,
        )
        for model, sizes in stats["batch_sizes"].items()
    }
    return render_page(request, "dashboard/models.html", "models", stats=stats, batch_charts=batch_charts)


@member
def energy_page(request: HttpRequest) -> HttpResponse:
    end = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    latest = last_traffic_ns(organization_id(request))
    if latest is not None:
        end = min(
            end,
            datetime.fromtimestamp(latest / 1e9, UTC).replace(minute=0, second=0, microsecond=0)
            + timedelta(hours=1),
        )
    start = end - timedelta(hours=48)
    devices = selectors.device_timelines(organization_id(request), start, end)
    for d in devices:
        d["chart"] = charts.bar_chart(
            d["labels"], [("batch energy", d["busy"]), ("idle energy", d["idle"])], unit="kWh", stacked=True
        )
    return render_page(request, "dashboard/energy.html", "energy", devices=devices, start=start, end=end)


@member
def carbon_page(request: HttpRequest) -> HttpResponse:
    end = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = end - timedelta(days=7)
    data = selectors.carbon_page(organization_id(request), start, end)
    for entry in data["sites"]:
        entry["chart"] = charts.bar_chart(
            entry["hours"], [("g CO2e per facility kWh", entry["intensity"])], unit="g/kWh", height=180
        )
    return render_page(request, "dashboard/carbon.html", "carbon", data=data, start=start, end=end)


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
                    end=form.cleaned_data["end"],
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


@member
def settings_page(request: HttpRequest) -> HttpResponse:
    org_id = organization_id(request)
    org = request.membership.organization  # type: ignore[attr-defined]
    action = request.POST.get("action") if request.method == "POST" else None
    if action and not can(request, "admin"):
        raise PermissionDenied("changing settings needs the admin role")
    site_form = forms.SiteForm(request.POST if action == "site" else None, prefix="site")
    key_form = forms.ApiKeyForm(request.POST if action == "key" else None, prefix="key")
    instrument_form = forms.InstrumentForm(
        request.POST if action == "instrument" else None, prefix="instrument"
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
            return HttpResponseRedirect("/dashboard/settings")
        except ServiceError as exc:
            _error(site_form, exc, ("zone", "name", "pue"))
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
        return HttpResponseRedirect("/dashboard/settings")
    elif action == "instrument" and instrument_form.is_valid():
        data = dict(instrument_form.cleaned_data)
        chosen = set(data.pop("criteria"))
        criteria = {key: key in chosen for key, _ in forms.CRITERIA}
        try:
            carbon.instrument_create(
                organization=org, quality_criteria=criteria, created_by=str(request.user), **data
            )
            messages.success(request, f"Instrument {data['instrument_id']} recorded.")
            return HttpResponseRedirect("/dashboard/settings")
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
        return HttpResponseRedirect("/dashboard/settings")
    devices = Device.objects.filter(site__organization_id=org_id).select_related("site")
    return render_page(
        request,
        "dashboard/settings.html",
        "settings",
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
                ),
            )
            for d in devices
        ],
        keys=ApiKey.objects.filter(organization_id=org_id),
        instruments=carbon_instruments(org_id),
        imports=FactorImport.objects.filter(organization_id=org_id)[:20],
        site_form=site_form,
        key_form=key_form,
        instrument_form=instrument_form,
        upload_form=upload_form,
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
    return render(
        request,
        "home.html",
        {"model_repository": settings.MODEL_REPOSITORY, "attributions": factor_attributions()},
    )
