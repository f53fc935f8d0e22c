"""NVIDIA GPU energy via NVML (the ``pynvml`` module from ``nvidia-ml-py``).

Two methods, chosen per GPU when the meter is constructed:

* ``nvml-counter``: ``nvmlDeviceGetTotalEnergyConsumption`` -- millijoules
  since the driver was loaded, available on Volta and newer. The driver
  refreshes it only every ~20-100 ms, so a read of a shorter interval can
  legitimately show 0 J (and the next one a larger step). Sum deltas over
  many requests, or bracket longer work, rather than trusting single short
  intervals.
* ``nvml-power-integration``: when the counter is not supported, a background
  thread samples ``nvmlDeviceGetPowerUsage`` (milliwatts) every
  ``sample_period_s`` and integrates with the trapezoid rule; every ``read()``
  also takes a sample so a reading covers the time up to the read.

NVML device indices follow PCI bus order, which is *not* CUDA's default order
(fastest first); set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` in the serving process
or match devices by UUID -- the meter's ``device_id`` is the GPU UUID for that
reason (it is also what Triton labels its metrics with).
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Callable
from typing import Any

from .base import ClockNs, CounterAccumulator, Meter, MeterError, MeterMethod, PeriodicThread

# NVML return codes (nvml.h); used when an injected module lacks the constants.
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_FUNCTION_NOT_FOUND = 13

DEFAULT_SAMPLE_PERIOD_S = 0.02


def import_pynvml() -> Any:
    """Import ``pynvml`` lazily so importing this package never needs it.

    Returns the module typed as ``Any``: pynvml ships no type information.
    """
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise MeterError("nvml: the pynvml module (pip package nvidia-ml-py) is not installed") from exc


def _text(value: object) -> str:
    # pynvml returns bytes or str depending on its version.
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _is_not_supported(nvml: Any, exc: BaseException) -> bool:
    """True for errors meaning "this GPU/driver cannot do that" (fallback), not "it failed"."""
    codes = {
        getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", _NVML_ERROR_NOT_SUPPORTED),
        # An old libnvidia-ml without the symbol at all.
        getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", _NVML_ERROR_FUNCTION_NOT_FOUND),
    }
    return getattr(exc, "value", None) in codes


def nvml_device_count(nvml_module: Any = None) -> int:
    """Number of GPUs NVML sees. Raises :class:`MeterError` when NVML is unusable."""
    nvml = nvml_module if nvml_module is not None else import_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise MeterError(f"nvml: nvmlInit failed: {exc}") from exc
    try:
        return int(nvml.nvmlDeviceGetCount())
    except nvml.NVMLError as exc:
        raise MeterError(f"nvml: nvmlDeviceGetCount failed: {exc}") from exc
    finally:
        _shutdown_quietly(nvml)


def _shutdown_quietly(nvml: Any) -> None:
    # nvmlInit/nvmlShutdown are reference counted; each meter balances its own
    # init. A failing shutdown leaves nothing for us to do.
    with contextlib.suppress(nvml.NVMLError):
        nvml.nvmlShutdown()


class _TrapezoidIntegrator:
    """Integrates power samples (W at t_ns) into joules."""

    __slots__ = ("energy_j", "last_p_w", "last_t_ns")

    def __init__(self) -> None:
        self.energy_j = 0.0
        self.last_t_ns: int | None = None
        self.last_p_w = 0.0

    def add(self, t_ns: int, p_w: float) -> None:
        if self.last_t_ns is not None:
            if t_ns <= self.last_t_ns:
                # Same clock tick: nothing elapsed, keep the earlier sample.
                return
            self.energy_j += (self.last_p_w + p_w) / 2.0 * (t_ns - self.last_t_ns) / 1e9
        self.last_t_ns = t_ns
        self.last_p_w = p_w


class NvmlMeter(Meter):
    """Energy of one NVIDIA GPU, by NVML index.

    Args:
        index: NVML device index (PCI bus order, see module doc).
        nvml_module: the ``pynvml`` module or a stand-in with the same functions
            (tests inject a fake); ``None`` imports ``pynvml``.
        sample_period_s: power sampling period for the integration fallback.
        force_power_integration: use power integration even when the energy
            counter is supported (for comparisons, see ``bench/gpu_check.py``).
        background_sampling: sample power on a background thread in the
            fallback mode. With ``False`` samples are only taken at ``start()``
            and ``read()`` -- deterministic, used by tests.
        clock_ns: monotonic clock for reading timestamps and integration.

    Raises:
        MeterError: NVML cannot be initialised, the index does not exist, or the
            GPU supports neither the energy counter nor power readings.
    """

    def __init__(
        self,
        index: int = 0,
        *,
        nvml_module: Any = None,
        sample_period_s: float = DEFAULT_SAMPLE_PERIOD_S,
        force_power_integration: bool = False,
        background_sampling: bool = True,
        clock_ns: ClockNs = time.monotonic_ns,
    ) -> None:
        if sample_period_s <= 0:
            raise ValueError(f"sample_period_s must be > 0, got {sample_period_s!r}")
        nvml = nvml_module if nvml_module is not None else import_pynvml()
        self._nvml = nvml
        self._index = index
        self._label = f"nvml GPU {index}"
        self._sample_period_s = sample_period_s
        self._background_sampling = background_sampling
        self._sampler: PeriodicThread | None = None
        self._counter = CounterAccumulator()
        self._integrator = _TrapezoidIntegrator()
        self._shutdown_done = threading.Event()

        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise MeterError(f"{self._label}: nvmlInit failed: {exc}") from exc
        try:
            self._handle = self._call("nvmlDeviceGetHandleByIndex", nvml.nvmlDeviceGetHandleByIndex, index)
            uuid = _text(self._call("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, self._handle))
            self._label = f"nvml GPU {index} ({uuid})"
            self._info: dict[str, str] = {"index": str(index), "uuid": uuid}
            self._add_info("name", nvml.nvmlDeviceGetName, self._handle)
            self._add_info("driver_version", nvml.nvmlSystemGetDriverVersion)
            self._method: MeterMethod = self._probe(force_power_integration)
            self._info["method"] = self._method
        except BaseException:
            _shutdown_quietly(nvml)
            self._shutdown_done.set()
            raise
        super().__init__(uuid, clock_ns=clock_ns)

    @property
    def method(self) -> MeterMethod:
        return self._method

    @property
    def index(self) -> int:
        return self._index

    @property
    def last_sample_error(self) -> BaseException | None:
        """Last error of the background power sampler (fallback mode), if any."""
        return self._sampler.last_error if self._sampler is not None else None

    def device_info(self) -> dict[str, str]:
        return dict(self._info)

    # -- internals ---------------------------------------------------------

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            raise MeterError(f"{self._label}: {what} failed: {exc}") from exc

    def _add_info(self, key: str, fn: Callable[..., Any], *args: Any) -> None:
        # Descriptive only: a GPU whose name cannot be read can still be metered.
        with contextlib.suppress(self._nvml.NVMLError):
            self._info[key] = _text(fn(*args))

    def _probe(self, force_power_integration: bool) -> MeterMethod:
        nvml = self._nvml
        if not force_power_integration:
            try:
                nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
                return "nvml-counter"
            except nvml.NVMLError as exc:
                if not _is_not_supported(nvml, exc):
                    raise MeterError(
                        f"{self._label}: nvmlDeviceGetTotalEnergyConsumption failed: {exc}"
                    ) from exc
        try:
            nvml.nvmlDeviceGetPowerUsage(self._handle)
        except nvml.NVMLError as exc:
            if _is_not_supported(nvml, exc):
                raise MeterError(
                    f"{self._label}: supports neither the energy counter nor power readings ({exc})"
                ) from exc
            raise MeterError(f"{self._label}: nvmlDeviceGetPowerUsage failed: {exc}") from exc
        return "nvml-power-integration"

    def _raw_counter_mj(self) -> int:
        fn = self._nvml.nvmlDeviceGetTotalEnergyConsumption
        return int(self._call("nvmlDeviceGetTotalEnergyConsumption", fn, self._handle))

    def _sample_power(self) -> None:
        p_mw = self._call("nvmlDeviceGetPowerUsage", self._nvml.nvmlDeviceGetPowerUsage, self._handle)
        self._integrator.add(self._clock_ns(), float(p_mw) / 1000.0)

    def _sample_from_thread(self) -> None:
        with self._lock:
            if self.started:
                self._sample_power()

    def _start(self) -> None:
        if self._method == "nvml-counter":
            self._counter = CounterAccumulator()
            self._counter.feed(self._raw_counter_mj())
            return
        self._integrator = _TrapezoidIntegrator()
        self._sample_power()
        if self._background_sampling:
            self._sampler = PeriodicThread(
                f"nvml-power-{self._index}", self._sample_period_s, self._sample_from_thread
            )
            self._sampler.start()

    def _read(self) -> tuple[float, int]:
        if self._method == "nvml-counter":
            total_mj = self._counter.feed(self._raw_counter_mj())
            return total_mj / 1000.0, self._clock_ns()
        self._sample_power()
        t_ns = self._integrator.last_t_ns
        assert t_ns is not None  # _start took a sample
        return self._integrator.energy_j, t_ns

    def _close(self, *, was_started: bool) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        if not self._shutdown_done.is_set():
            self._shutdown_done.set()
            _shutdown_quietly(self._nvml)
