"""A stand-in for the ``pynvml`` module, injected via ``nvml_module=``.

Only the functions the meters and ``bench/gpu_check.py`` call are provided.
Error classes mirror pynvml's: one ``NVMLError`` base with a ``value`` (the
NVML return code) and a subclass per code, so ``except nvml.NVMLError`` and
``exc.value == nvml.NVML_ERROR_NOT_SUPPORTED`` both work as with the real one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    value: int = NVML_ERROR_UNKNOWN

    def __init__(self, value: int | None = None) -> None:
        if value is not None:
            self.value = value
        super().__init__(self.value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_Uninitialized(NVMLError):
    value = NVML_ERROR_UNINITIALIZED


class NVMLError_InvalidArgument(NVMLError):
    value = NVML_ERROR_INVALID_ARGUMENT


class NVMLError_NotSupported(NVMLError):
    value = NVML_ERROR_NOT_SUPPORTED


class NVMLError_NoPermission(NVMLError):
    value = NVML_ERROR_NO_PERMISSION


class NVMLError_DriverNotLoaded(NVMLError):
    value = NVML_ERROR_DRIVER_NOT_LOADED


class NVMLError_LibraryNotFound(NVMLError):
    value = NVML_ERROR_LIBRARY_NOT_FOUND


class NVMLError_FunctionNotFound(NVMLError):
    value = NVML_ERROR_FUNCTION_NOT_FOUND


class NVMLError_GpuIsLost(NVMLError):
    value = NVML_ERROR_GPU_IS_LOST


# FakeNvml exposes NVMLError as a class attribute (like the module does), which
# shadows the name inside the class body; annotations there use this alias.
_NVMLErrorType = NVMLError


@dataclass
class FakeGpu:
    """State of one fake GPU. Mutate it from tests to drive the meter.

    ``energy_mj`` is the raw counter. ``queued_energy_mj`` values, when
    present, are returned (and become ``energy_mj``) one per counter call.
    With ``live=True`` on the :class:`FakeNvml`, the counter additionally grows
    at ``power_mw`` in real time, like a GPU under constant load.
    """

    uuid: str
    name: str = "NVIDIA Fake GPU"
    energy_mj: int = 0
    power_mw: int = 100_000
    power_limit_mw: int = 300_000
    counter_supported: bool = True
    power_supported: bool = True
    energy_step_mj: int = 0
    queued_energy_mj: deque[int] = field(default_factory=deque)
    power_calls: int = 0
    counter_calls: int = 0


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml:
    """A module-like object with pynvml's functions and error classes.

    Args:
        gpus: the fake GPUs, by NVML index.
        driver_version: returned by ``nvmlSystemGetDriverVersion``.
        return_bytes: return bytes from string functions, as old pynvml did.
        init_error: raised by ``nvmlInit`` (e.g. ``NVMLError_LibraryNotFound()``).
        live: counters advance with real time at each GPU's ``power_mw``.

    ``fail[function_name] = error`` makes that function raise ``error`` on
    every call until the entry is removed. ``active_inits`` tracks the
    nvmlInit/nvmlShutdown reference count.
    """

    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVML_SUCCESS = NVML_SUCCESS
    NVML_ERROR_NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    NVML_ERROR_FUNCTION_NOT_FOUND = NVML_ERROR_FUNCTION_NOT_FOUND
    NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST

    def __init__(
        self,
        gpus: Iterable[FakeGpu] | None = None,
        *,
        driver_version: str = "550.54.15",
        return_bytes: bool = False,
        init_error: _NVMLErrorType | None = None,
        live: bool = False,
    ) -> None:
        self.gpus = list(gpus) if gpus is not None else [FakeGpu("GPU-00000000-0000-0000-0000-000000000000")]
        self.driver_version = driver_version
        self.return_bytes = return_bytes
        self.init_error = init_error
        self.live = live
        self.fail: dict[str, _NVMLErrorType] = {}
        self.active_inits = 0
        self.init_calls = 0
        self._t0_ns = time.monotonic_ns()
        self._lock = threading.Lock()

    # -- test controls -------------------------------------------------------

    def gpu(self, index: int = 0) -> FakeGpu:
        return self.gpus[index]

    def reset_counter(self, index: int = 0, value_mj: int = 0) -> None:
        """Simulate a driver reload: the counter restarts from ``value_mj``."""
        self.gpus[index].energy_mj = value_mj

    # -- pynvml API ------------------------------------------------------------

    def _enter(self, name: str) -> None:
        if name in self.fail:
            raise self.fail[name]
        if self.active_inits <= 0:
            raise NVMLError_Uninitialized()

    def _str(self, value: str) -> str | bytes:
        return value.encode() if self.return_bytes else value

    def _gpu(self, handle: object) -> FakeGpu:
        if not isinstance(handle, _Handle):
            raise NVMLError_InvalidArgument()
        return self.gpus[handle.index]

    def nvmlInit(self) -> None:
        self.init_calls += 1
        if "nvmlInit" in self.fail:
            raise self.fail["nvmlInit"]
        if self.init_error is not None:
            raise self.init_error
        self.active_inits += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.active_inits -= 1

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._enter("nvmlSystemGetDriverVersion")
        return self._str(self.driver_version)

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        return _Handle(index)

    def nvmlDeviceGetUUID(self, handle: object) -> str | bytes:
        self._enter("nvmlDeviceGetUUID")
        return self._str(self._gpu(handle).uuid)

    def nvmlDeviceGetName(self, handle: object) -> str | bytes:
        self._enter("nvmlDeviceGetName")
        return self._str(self._gpu(handle).name)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption")
        gpu = self._gpu(handle)
        if not gpu.counter_supported:
            raise NVMLError_NotSupported()
        with self._lock:
            gpu.counter_calls += 1
            if gpu.queued_energy_mj:
                gpu.energy_mj = gpu.queued_energy_mj.popleft()
            else:
                gpu.energy_mj += gpu.energy_step_mj
            value = gpu.energy_mj
        if self.live:
            # mW x s = mJ
            value += gpu.power_mw * (time.monotonic_ns() - self._t0_ns) // 1_000_000_000
        return value

    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
        self._enter("nvmlDeviceGetPowerUsage")
        gpu = self._gpu(handle)
        if not gpu.power_supported:
            raise NVMLError_NotSupported()
        with self._lock:
            gpu.power_calls += 1
        return gpu.power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit")
        return self._gpu(handle).power_limit_mw
