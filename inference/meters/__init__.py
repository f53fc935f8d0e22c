"""Per-request energy meters (framework-free: no Django, no settings).

Quick use::

    from inference.meters import detect_meters

    meters = detect_meters(triton_url=None)
    for meter, why in meters:
        logger.info("energy meter %s: %s", meter.device_id, why)
        meter.start()

    meter, _ = meters[0]
    before = meter.read()
    ...  # serve the request
    joules = meter.read().delta_j(before)

Meter modules that need optional libraries (pynvml) import them lazily, so
importing this package is always cheap and safe.
"""

from .base import RELATIVE_UNCERTAINTY, CounterAccumulator, Meter, MeterError, MeterMethod, Reading
from .claims import DeviceHeld, FencedMeter, claim_devices
from .cpu_model import CpuModelMeter
from .nvml import NvmlMeter
from .rapl import RaplMeter, find_packages
from .registry import METER_CLASSES, Detection, detect_meters, load_meter_class, probe_meters
from .triton import TritonMeter, parse_prometheus_text

__all__ = [
    "METER_CLASSES",
    "RELATIVE_UNCERTAINTY",
    "CounterAccumulator",
    "CpuModelMeter",
    "Detection",
    "DeviceHeld",
    "FencedMeter",
    "Meter",
    "MeterError",
    "MeterMethod",
    "NvmlMeter",
    "RaplMeter",
    "Reading",
    "TritonMeter",
    "claim_devices",
    "detect_meters",
    "find_packages",
    "load_meter_class",
    "parse_prometheus_text",
    "probe_meters",
]
