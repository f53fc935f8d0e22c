"""Meter lookup by name and start-up detection of which meters a host supports.

:func:`detect_meters` returns each meter together with a one-line reason, so
start-up can log e.g. ``nvml: 1 GPU found; GPU 0 NVIDIA H200 (GPU-...) uses
the energy counter`` or ``cpu-model: no NVML or RAPL (...)``.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, TypedDict, Unpack

from .base import Meter, MeterError
from .cpu_model import CpuModelMeter
from .nvml import NvmlMeter, import_pynvml, nvml_device_count
from .rapl import DEFAULT_POWERCAP_ROOT, RaplMeter, find_packages
from .triton import DEFAULT_TIMEOUT_S, TritonMeter, discover_gpus

logger = logging.getLogger(__name__)

#: Short names accepted by :func:`load_meter_class`, mapped to dotted paths.
#: Dotted paths, so that a meter of another package plugs in the same way as these.
METER_CLASSES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "nvml": "inference.meters.nvml.NvmlMeter",
        "rapl": "inference.meters.rapl.RaplMeter",
        "triton": "inference.meters.triton.TritonMeter",
        "cpu-model": "inference.meters.cpu_model.CpuModelMeter",
    }
)

DEFAULT_SOURCES: Final[tuple[str, ...]] = ("nvml", "rapl", "triton", "cpu-model")


def load_meter_class(name_or_dotted_path: str) -> type[Meter]:
    """Return the meter class for a short name (see :data:`METER_CLASSES`) or a
    dotted path ``package.module.Class`` (``package.module:Class`` also works).

    Raises:
        MeterError: unknown name, unimportable module, missing attribute, or
            an attribute that is not a :class:`Meter` subclass.
    """
    path = METER_CLASSES.get(name_or_dotted_path, name_or_dotted_path)
    module_name, sep, attr = path.replace(":", ".").rpartition(".")
    if not sep or not module_name or not attr:
        raise MeterError(
            f"unknown meter {name_or_dotted_path!r}: use one of {', '.join(METER_CLASSES)} "
            "or a dotted path package.module.Class"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MeterError(f"meter {name_or_dotted_path!r}: cannot import {module_name}: {exc}") from exc
    cls = getattr(module, attr, None)
    if cls is None:
        raise MeterError(f"meter {name_or_dotted_path!r}: {module_name} has no attribute {attr}")
    if not (isinstance(cls, type) and issubclass(cls, Meter)):
        raise MeterError(f"meter {name_or_dotted_path!r}: {path} is not a Meter subclass")
    return cls


class DetectOptions(TypedDict, total=False):
    """Keyword arguments of :func:`probe_meters` / :func:`detect_meters`.

    Keys:
        sources: which of ``nvml``, ``rapl``, ``triton``, ``cpu-model`` to try
            (default: all).
        nvml_module: ``pynvml`` or a stand-in; ``None`` imports ``pynvml``.
        nvml_options: extra :class:`~inference.meters.nvml.NvmlMeter` kwargs.
        rapl_root: powercap root, default ``/sys/class/powercap``.
        rapl_include_dram: include DRAM zones (default True).
        triton_url: Triton metrics URL; Triton is skipped when absent.
        triton_timeout_s: HTTP timeout for Triton (default 2 s).
        cpu_model_options: :class:`~inference.meters.cpu_model.CpuModelMeter`
            kwargs (tdp_w, cores, memory_w_per_gb, cpu_time_s, ...).
        host_id: the host id in RAPL's and the modelled CPU's device ids
            (:mod:`inference.meters.host`); default detected.
        instance: names this process on its host in the modelled CPU's device
            id (a gateway gives its ledger chain id); default ``pid<pid>``.
    """

    sources: Sequence[str]
    nvml_module: Any
    nvml_options: Mapping[str, Any]
    rapl_root: str | Path
    rapl_include_dram: bool
    triton_url: str | None
    triton_timeout_s: float
    cpu_model_options: Mapping[str, Any]
    host_id: str | None
    instance: str | None


@dataclass
class Detection:
    """Result of :func:`probe_meters`.

    ``meters``: meters to use, each with why. ``skipped``: one line per source
    (or device) that was tried and not used, with why.
    """

    meters: list[tuple[Meter, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def close_all(self) -> None:
        for meter, _ in self.meters:
            meter.close()


def _probe_nvml(det: Detection, nvml_module: Any, nvml_options: Mapping[str, Any]) -> None:
    try:
        nvml = nvml_module if nvml_module is not None else import_pynvml()
        count = nvml_device_count(nvml)
    except MeterError as exc:
        det.skipped.append(f"nvml: not available ({exc})")
        return
    if count == 0:
        det.skipped.append("nvml: NVML works but found no GPU")
        return
    plural = "GPU" if count == 1 else "GPUs"
    for index in range(count):
        try:
            meter = NvmlMeter(index, nvml_module=nvml, **nvml_options)
        except MeterError as exc:
            det.skipped.append(f"nvml: {count} {plural} found; GPU {index} unusable: {exc}")
            continue
        info = meter.device_info()
        how = (
            "uses the energy counter"
            if meter.method == "nvml-counter"
            else "integrates power samples (energy counter not supported)"
        )
        det.meters.append(
            (
                meter,
                f"nvml: {count} {plural} found; GPU {index} {info.get('name', '?')} ({meter.device_id}) {how}",
            )
        )


def _probe_rapl(det: Detection, root: str | Path, include_dram: bool, host_id: str | None) -> None:
    try:
        packages = find_packages(root)
    except MeterError as exc:
        det.skipped.append(str(exc))
        return
    for pkg in packages:
        try:
            meter = RaplMeter(pkg.number, root=root, include_dram=include_dram, host_id=host_id)
        except MeterError as exc:
            det.skipped.append(str(exc))
            continue
        dram = " + dram" if meter.includes_dram else ""
        det.meters.append((meter, f"rapl: {pkg.zone.name}{dram} at {pkg.zone.path}"))


def _probe_triton(det: Detection, url: str | None, timeout_s: float) -> None:
    if not url:
        det.skipped.append("triton: no metrics URL configured")
        return
    try:
        uuids = discover_gpus(url, timeout_s=timeout_s)
    except MeterError as exc:
        det.skipped.append(str(exc))
        return
    local = {m.device_id for m, _ in det.meters}
    for uuid in uuids:
        if uuid in local:
            # Same GPU seen through local NVML: the direct counter is finer-grained.
            det.skipped.append(f"triton: {uuid} already metered locally by NVML")
            continue
        try:
            meter = TritonMeter(url, uuid, timeout_s=timeout_s)
        except MeterError as exc:
            det.skipped.append(str(exc))
            continue
        det.meters.append((meter, f"triton: {uuid} energy from {url}"))


def cpu_model_meter(
    cpu_model_options: Mapping[str, Any], host_id: str | None = None, instance: str | None = None
) -> CpuModelMeter:
    """This process's modelled CPU meter, as :func:`probe_meters` makes it (and a fallback needs it)."""
    return CpuModelMeter(**{"host_id": host_id, "instance": instance, **cpu_model_options})


def _probe_cpu_model(
    det: Detection, cpu_model_options: Mapping[str, Any], host_id: str | None, instance: str | None
) -> None:
    host_measured = [m for m, _ in det.meters if m.method != "triton"]
    if host_measured:
        det.skipped.append("cpu-model: not needed, NVML/RAPL meters found")
        return
    why = "; ".join(s for s in det.skipped if s.startswith(("nvml", "rapl")))
    meter = cpu_model_meter(cpu_model_options, host_id, instance)
    reason = "cpu-model: no NVML or RAPL"
    det.meters.append((meter, f"{reason} ({why})" if why else reason))


def probe_meters(**options: Unpack[DetectOptions]) -> Detection:
    """Try each source and return the meters to use plus why others were skipped.

    Order: NVML, RAPL, Triton (a Triton GPU also visible to local NVML is left to
    NVML), then the CPU model -- used only when neither NVML nor RAPL gave a
    meter, since then nothing measures this host.
    """
    sources = tuple(options.get("sources", DEFAULT_SOURCES))
    unknown = [s for s in sources if s not in METER_CLASSES]
    if unknown:
        raise ValueError(f"unknown meter sources {unknown}; known: {', '.join(METER_CLASSES)}")
    det = Detection()
    try:
        if "nvml" in sources:
            _probe_nvml(det, options.get("nvml_module"), options.get("nvml_options", {}))
        if "rapl" in sources:
            _probe_rapl(
                det,
                options.get("rapl_root", DEFAULT_POWERCAP_ROOT),
                options.get("rapl_include_dram", True),
                options.get("host_id"),
            )
        if "triton" in sources:
            _probe_triton(det, options.get("triton_url"), options.get("triton_timeout_s", DEFAULT_TIMEOUT_S))
        if "cpu-model" in sources:
            _probe_cpu_model(
                det, options.get("cpu_model_options", {}), options.get("host_id"), options.get("instance")
            )
    except BaseException:
        det.close_all()
        raise
    return det


def detect_meters(**options: Unpack[DetectOptions]) -> list[tuple[Meter, str]]:
    """Meters to use on this host, each with the reason it was chosen.

    Sources that were tried and not used are logged at INFO on this module's
    logger; use :func:`probe_meters` to get them as data. The meters are not
    started; the caller starts and eventually closes them.
    """
    det = probe_meters(**options)
    for line in det.skipped:
        logger.info("energy meter skipped: %s", line)
    return det.meters
