"""Core types shared by all energy meters.

A meter reports *cumulative* energy for one device since :meth:`Meter.start`.
Callers attribute energy to a piece of work by reading before and after it and
subtracting (:meth:`Reading.delta_j`). Keeping the meter cumulative (rather than
"energy since the last read") means several threads can bracket overlapping
requests with the same meter without stealing each other's energy.

This module is deliberately framework-free: no Django, no settings; every knob
is a constructor argument so the meters can be unit-tested and reused.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from inference.errors import THREAD_ERRORS, ThreadErrors

MeterMethod = Literal["nvml-counter", "nvml-power-integration", "rapl", "triton", "modelled"]

#: Nominal relative uncertainty (1 sigma-ish, as a fraction of the reported
#: energy) per measurement method. These are engineering estimates meant to be
#: carried into carbon figures as error bars, not calibrated values:
#:
#: * ``nvml-counter`` 5 %: NVML's documentation gives +/-5 % of the current draw
#:   for its power readings (nvidia-smi quotes +/-5 W on newer boards); the
#:   energy counter is fed by the same board sensor.
#: * ``nvml-power-integration`` 10 %: the same +/-5 % sensor error plus sampling
#:   error (short bursts between samples are missed, and on recent drivers the
#:   reported power is itself an average over up to ~1 s, which smears edges).
#: * ``rapl`` 5 %: since Haswell (and on AMD Zen) RAPL is measured rather than
#:   modelled, and validation studies report close agreement with external
#:   measurements for the package/DRAM domains it covers. It does not cover the
#:   PSU, fans, disks or NICs, which is why wall power is higher.
#: * ``triton`` 10 %: the Triton server derives it from the NVML counter but only
#:   refreshes it every metrics interval (2 s by default), so attribution of a
#:   short request to the right interval is coarse.
#: * ``modelled`` 30 %: CPU-time x TDP/cores is a model, not a measurement; real
#:   power depends on frequency, load type and idle/uncore power. The error can
#:   exceed 30 %; the figure marks the value as the least trustworthy.
RELATIVE_UNCERTAINTY: Final[dict[MeterMethod, float]] = {
    "nvml-counter": 0.05,
    "nvml-power-integration": 0.10,
    "rapl": 0.05,
    "triton": 0.10,
    "modelled": 0.30,
}

ClockNs = Callable[[], int]


class MeterError(RuntimeError):
    """A meter could not be opened or read.

    The message always names the device (and file/URL/NVML call where there is
    one) so it can be logged as is.
    """


@dataclass(frozen=True, slots=True)
class Reading:
    """One cumulative energy reading.

    Attributes:
        device_id: the meter's device id (GPU UUID, ``rapl:intel-rapl:0``, ...).
        t_ns: ``time.monotonic_ns()`` (or the meter's injected clock) when the
            value was taken. Only comparable with readings from the same process.
        energy_j: joules since the meter was started; never decreases between
            successive reads of one meter.
    """

    device_id: str
    t_ns: int
    energy_j: float

    def __post_init__(self) -> None:
        if not math.isfinite(self.energy_j) or self.energy_j < 0:
            raise ValueError(f"energy_j must be finite and >= 0, got {self.energy_j!r}")

    def delta_j(self, earlier: Reading) -> float:
        """Joules consumed between ``earlier`` and this reading."""
        if earlier.device_id != self.device_id:
            raise ValueError(
                f"readings are from different devices: {earlier.device_id!r} vs {self.device_id!r}"
            )
        # Clamp: readings taken by different threads may arrive out of order.
        return max(0.0, self.energy_j - earlier.energy_j)

    def seconds_since(self, earlier: Reading) -> float:
        return (self.t_ns - earlier.t_ns) / 1e9


class CounterAccumulator:
    """Turns raw readings of a hardware energy counter into a cumulative total.

    The first value fed is the baseline (total 0). After that every value adds
    its non-negative delta to the total. When the raw value goes *down*:

    * with ``wrap_at`` set (a counter that wraps at a known maximum, e.g. RAPL's
      ``max_energy_range_uj``) it is taken as exactly one wrap-around:
      ``delta = (wrap_at - previous) + raw``. More than one wrap between two
      values cannot be detected from the values alone, so callers must feed at
      least once per wrap period.
    * without ``wrap_at`` (a counter that only goes backwards when the driver or
      server restarts and the counter restarts from zero) the new raw value is
      taken as the energy since the reset, i.e. it becomes the new base:
      ``delta = raw``. Energy between the last value before the reset and the
      reset itself is unknowable and is neither invented nor double-counted.

    Not thread-safe on its own: callers feed it under their own lock, *together
    with* taking the raw value, since feeding values out of order would look
    like a reset.
    """

    __slots__ = ("_last", "_total", "resets", "wrap_at", "wraps")

    def __init__(self, wrap_at: float | None = None) -> None:
        if wrap_at is not None and wrap_at <= 0:
            raise ValueError(f"wrap_at must be > 0, got {wrap_at!r}")
        self.wrap_at = wrap_at
        self._last: float | None = None
        self._total = 0.0
        self.resets = 0
        self.wraps = 0

    @property
    def total(self) -> float:
        """Cumulative total in the raw counter's unit."""
        return self._total

    def feed(self, raw: float) -> float:
        """Account ``raw`` and return the new cumulative total."""
        if raw < 0 or not math.isfinite(raw):
            raise ValueError(f"raw counter value must be finite and >= 0, got {raw!r}")
        last = self._last
        self._last = raw
        if last is None:
            return self._total
        if raw >= last:
            delta = raw - last
        elif self.wrap_at is not None:
            self.wraps += 1
            delta = (self.wrap_at - last) + raw
        else:
            self.resets += 1
            delta = raw
        self._total += delta
        return self._total


class Meter(ABC):
    """An energy meter for one device.

    Life cycle: construct (opens the device and raises :class:`MeterError` if
    that is impossible) -> :meth:`start` -> :meth:`read` any number of times,
    from any number of threads -> :meth:`close` (idempotent). A meter can be
    used as a context manager, which starts and closes it.

    Subclasses implement :meth:`_start`, :meth:`_read` and :meth:`_close`; this
    class serialises them with one lock so that raw values are taken and
    accounted in order, and enforces the life cycle.
    """

    def __init__(self, device_id: str, *, clock_ns: ClockNs = time.monotonic_ns) -> None:
        self._device_id = device_id
        self._clock_ns = clock_ns
        # RLock so subclasses may call locked helpers from locked code.
        self._lock = threading.RLock()
        self._state: Literal["new", "started", "closed"] = "new"
        self._last_energy_j = 0.0
        self._last_t_ns = 0

    @property
    def device_id(self) -> str:
        return self._device_id

    @property
    @abstractmethod
    def method(self) -> MeterMethod:
        """How the energy is obtained; see :data:`RELATIVE_UNCERTAINTY`."""

    @property
    def measured(self) -> bool:
        """False when the energy is modelled rather than measured."""
        return self.method != "modelled"

    @property
    def relative_uncertainty(self) -> float:
        return RELATIVE_UNCERTAINTY[self.method]

    @property
    def started(self) -> bool:
        return self._state == "started"

    @abstractmethod
    def device_info(self) -> dict[str, str]:
        """Descriptive facts about the device (uuid, name, driver version... where known)."""

    def start(self) -> None:
        """Take the baseline; energy is reported relative to this moment."""
        with self._lock:
            if self._state == "started":
                raise MeterError(f"{self._device_id}: meter already started")
            if self._state == "closed":
                raise MeterError(f"{self._device_id}: meter is closed")
            self._start()
            self._last_energy_j = 0.0
            self._last_t_ns = 0
            self._state = "started"

    def read(self) -> Reading:
        """Return the energy consumed since :meth:`start`."""
        with self._lock:
            if self._state != "started":
                raise MeterError(f"{self._device_id}: read() on a meter that is {self._state}, not started")
            energy_j, t_ns = self._read()
            # Belt and braces: subclasses are non-decreasing by construction, but
            # a float rounding or clock quirk must never produce a negative delta.
            energy_j = max(energy_j, self._last_energy_j)
            t_ns = max(t_ns, self._last_t_ns)
            self._last_energy_j = energy_j
            self._last_t_ns = t_ns
            return Reading(self._device_id, t_ns, energy_j)

    def close(self) -> None:
        """Release the device. Safe to call more than once."""
        with self._lock:
            if self._state == "closed":
                return
            was = self._state
            self._state = "closed"
        # Outside the lock: _close may join a background thread that itself
        # takes the lock for each sample.
        self._close(was_started=was == "started")

    def __enter__(self) -> Meter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._device_id} {self.method} {self._state}>"

    @abstractmethod
    def _start(self) -> None:
        """Take the baseline. Called with the lock held."""

    @abstractmethod
    def _read(self) -> tuple[float, int]:
        """Return ``(joules since start, t_ns)``. Called with the lock held."""

    def _close(self, *, was_started: bool) -> None:  # noqa: B027 - optional hook, default no-op
        """Release resources. Called once, without the lock held."""


class PeriodicThread:
    """Calls ``fn`` every ``period_s`` on a daemon thread until :meth:`stop`.

    Exceptions from ``fn`` are stored in :attr:`last_error`, counted in
    ``thread_errors`` (shown in /metrics), logged once (not once a period while
    they repeat), and the loop carries on: a transient failure must not silently
    stop sampling for good.
    """

    def __init__(
        self,
        name: str,
        period_s: float,
        fn: Callable[[], None],
        thread_errors: ThreadErrors = THREAD_ERRORS,
    ) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s!r}")
        self._period_s = period_s
        self._fn = fn
        self._thread_errors = thread_errors
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.last_error: BaseException | None = None
        self.errors = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        # Event.wait doubles as an interruptible sleep so stop() is prompt.
        while not self._stop.wait(self._period_s):
            try:
                self._fn()
            except Exception as exc:  # stored for diagnostics, see class doc
                self.last_error = exc
                self.errors += 1
                self._thread_errors.record(
                    exc,
                    f"periodic meter thread {self._thread.name} failed; it retries every {self._period_s} s",
                )
