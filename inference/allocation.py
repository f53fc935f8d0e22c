"""Per-request attribution of metered device energy.

A device (GPU, CPU package) exposes a cumulative energy counter. Two consecutive
readings of it bound an *interval* whose energy is known exactly; nothing finer is
known. This module divides each interval's energy into an idle share and one share
per batch that ran in the interval, then divides each batch share over the batch's
requests by work units.

Everything is integer micro-joules (µJ). Each reading is converted to µJ exactly once
(round half-even of the cumulative value), so interval energies telescope: the sum
of all interval energies equals the last cumulative µJ minus the first, exactly.
Every split uses the largest-remainder (Hamilton) method, so the parts of a split
are non-negative integers that add up to the whole, with no µJ created or lost.

The module is framework-free (stdlib only); the ledger that persists the
allocations lives elsewhere.

Streaming use, one :class:`EnergyAccountant` per device::

    acct = EnergyAccountant("gpu0", idle_power_w=55.0)
    acct.begin_batch("b1")                      # before the batch starts (optional, see below)
    ...                                         # run the batch
    acct.add_batch(BatchRecord("b1", s, e, [("req-1", 12), ("req-2", 30)], "resnet", "3"))
    acct.add_reading(t_ns, energy_j)            # from the timer / at batch boundaries
    for allocation in acct.drain():
        ...                                     # persist

Timestamps (batch start/end and reading times) must come from one clock, e.g.
``time.monotonic_ns()``.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NamedTuple

__all__ = [
    "AccountantStats",
    "BatchPart",
    "BatchRecord",
    "EnergyAccountant",
    "IntervalAllocation",
    "MeterReading",
    "RequestPart",
    "RequestWork",
    "allocate_interval",
    "joules_to_uj",
    "split_largest_remainder",
]

logger = logging.getLogger(__name__)

UJ_PER_J = 1_000_000
# W x ns = 1e-9 J = 1e-3 µJ.
_NS_PER_UJ_AT_1W = 1_000


# --------------------------------------------------------------------------- helpers


def _exact(value: float, what: str) -> Fraction:
    """Exact rational value of ``value`` as a person reads it.

    Floats go through their shortest ``repr`` so that 2.5e-06 J is exactly 2.5 µJ
    (its binary expansion is not), which makes half-even rounding match hand
    computation. ``float()`` first, because NumPy 2 scalars repr as ``np.float64(...)``.
    """
    if isinstance(value, int):
        return Fraction(value)
    as_float = float(value)
    if not math.isfinite(as_float):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return Fraction(repr(as_float))


def joules_to_uj(energy_j: float) -> int:
    """Convert a cumulative counter value in joules to integer µJ (round half-even)."""
    return round(_exact(energy_j, "energy_j") * UJ_PER_J)


def _idle_power(idle_power_w: float) -> Fraction:
    power = _exact(idle_power_w, "idle_power_w")
    if power < 0:
        raise ValueError(f"idle_power_w must be >= 0, got {idle_power_w!r}")
    return power


def split_largest_remainder(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` into non-negative integers proportional to ``weights``.

    Largest-remainder (Hamilton) method: every part gets the floor of its exact
    quota, then the units still missing go one each to the largest remainders; equal
    remainders go to the lower index. The parts always sum to ``total`` exactly and a
    zero weight always gets 0. All arithmetic is integer, so the result does not
    depend on float rounding.

    Raises ``ValueError`` for a negative total or weight, or for a non-zero total
    with no positive weight (there would be nowhere to put it).
    """
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    if any(w < 0 for w in weights):
        raise ValueError(f"weights must be >= 0, got {list(weights)}")
    weight_sum = sum(weights)
    if weight_sum == 0:
        if total == 0:
            return [0] * len(weights)
        raise ValueError(f"cannot split {total} over zero total weight")
    parts: list[int] = []
    remainders: list[int] = []
    for w in weights:
        quotient, remainder = divmod(total * w, weight_sum)
        parts.append(quotient)
        remainders.append(remainder)
    # Fewer leftover units than entries with a non-zero remainder (the remainders
    # sum to leftover * weight_sum and each is < weight_sum), so zero weights are
    # never picked.
    leftover = total - sum(parts)
    by_remainder = sorted(range(len(parts)), key=lambda i: (-remainders[i], i))
    for i in by_remainder[:leftover]:
        parts[i] += 1
    return parts


def _union_ns(spans: Iterable[tuple[int, int]]) -> int:
    """Measure of the union of half-open ``[lo, hi)`` spans."""
    total = 0
    current_lo: int | None = None
    current_hi = 0
    for lo, hi in sorted(spans):
        if current_lo is None or lo > current_hi:
            if current_lo is not None:
                total += current_hi - current_lo
            current_lo, current_hi = lo, hi
        elif hi > current_hi:
            current_hi = hi
    if current_lo is not None:
        total += current_hi - current_lo
    return total


# --------------------------------------------------------------------------- records


class RequestWork(NamedTuple):
    """One request of a batch and its work units (elements, tokens, ...)."""

    request_id: str
    work_units: int


@dataclass(frozen=True, slots=True)
class BatchRecord:
    """A batch that ran on the device during ``[start_ns, end_ns]``.

    ``requests`` accepts any sequence of ``(request_id, work_units)`` pairs and is
    stored as a tuple of :class:`RequestWork`. Request ids must be unique within the
    batch; the same request id may appear in several batches (e.g. decode steps of a
    generation), its parts are then reported per batch. If every request has 0 work
    units the batch energy is split equally.

    A zero-length batch (``start_ns == end_ns``) is accepted but has no busy time,
    so it never receives energy.
    """

    batch_id: str
    start_ns: int
    end_ns: int
    requests: Sequence[tuple[str, int]]
    model_name: str = ""
    model_version: str = ""

    def __post_init__(self) -> None:
        if self.end_ns < self.start_ns:
            raise ValueError(f"batch {self.batch_id!r}: end_ns {self.end_ns} < start_ns {self.start_ns}")
        normalized = tuple(RequestWork(str(rid), int(units)) for rid, units in self.requests)
        if not normalized:
            # Its energy would have no request to go to and conservation would break.
            raise ValueError(f"batch {self.batch_id!r} has no requests")
        if any(r.work_units < 0 for r in normalized):
            raise ValueError(f"batch {self.batch_id!r}: work_units must be >= 0")
        if len({r.request_id for r in normalized}) != len(normalized):
            raise ValueError(f"batch {self.batch_id!r}: duplicate request_id")
        object.__setattr__(self, "requests", normalized)


@dataclass(frozen=True, slots=True)
class MeterReading:
    """A cumulative counter value ``energy_j`` (J) read at ``t_ns``.

    ``energy_uj`` is derived once, here, so every interval that shares this reading
    as a boundary sees the same integer and interval energies telescope.
    """

    t_ns: int
    energy_j: float
    energy_uj: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "energy_uj", joules_to_uj(self.energy_j))


@dataclass(frozen=True, slots=True)
class BatchPart:
    """The energy one batch received from one interval.

    ``busy_ns`` is the batch's own duration clipped to the interval (its weight).
    """

    batch_id: str
    model_name: str
    model_version: str
    busy_ns: int
    energy_uj: int


@dataclass(frozen=True, slots=True)
class RequestPart:
    """The energy one request received from one interval, through one batch.

    A request's total energy is the sum of its parts over all intervals.
    """

    batch_id: str
    request_id: str
    model_name: str
    model_version: str
    work_units: int
    energy_uj: int


@dataclass(frozen=True, slots=True)
class IntervalAllocation:
    """How the energy of one closed interval ``[t0_ns, t1_ns]`` was divided.

    Invariants: ``idle_uj + sum(b.energy_uj for b in batch_parts) == energy_uj``;
    for each batch, the sum of its request parts equals its batch part; every part
    is >= 0. ``idle_estimate_uj`` is idle power x idle time before clamping to the
    metered energy (kept to spot a wrong idle-power setting); ``idle_uj`` is what was
    actually charged to idle: at most the estimate plus ``idle_owed_in_uj``, the idle
    energy earlier intervals left uncharged (negative: charged beyond their estimates).
    ``idle_owed_out_uj`` is the same balance after this interval (before any cap the
    caller applies).
    """

    device_id: str
    t0_ns: int
    t1_ns: int
    counter_start_j: float
    counter_end_j: float
    counter_start_uj: int
    counter_end_uj: int
    energy_uj: int
    idle_uj: int
    idle_estimate_uj: int
    busy_ns: int
    idle_ns: int
    idle_power_w: float
    batch_parts: tuple[BatchPart, ...]
    request_parts: tuple[RequestPart, ...]
    idle_owed_in_uj: int = 0
    idle_owed_out_uj: int = 0

    @property
    def duration_ns(self) -> int:
        return self.t1_ns - self.t0_ns

    @property
    def active_uj(self) -> int:
        """Energy charged to batches (``energy_uj - idle_uj``)."""
        return self.energy_uj - self.idle_uj


# --------------------------------------------------------------------------- pure core


def allocate_interval(
    device_id: str,
    start: MeterReading,
    end: MeterReading,
    batches: Iterable[BatchRecord],
    idle_power_w: float,
    idle_owed_uj: int = 0,
) -> IntervalAllocation:
    """Divide the energy metered between ``start`` and ``end`` over idle and batches.

    * busy time is the measure of the union of the batches clipped to the interval,
      so overlapping batches (several models on one device) do not shrink idle twice;
    * idle gets ``min(E, max(0, round(idle_power_w x idle_time) + idle_owed_uj))``;
      with no batch in the interval idle gets all of E. ``idle_owed_uj`` is the device's
      idle balance from earlier intervals: idle energy they left uncharged (> 0), or
      charged beyond their estimates (< 0, a batch-free interval that read long). A
      counter that updates every 20-100 ms makes each interval read a little early or
      late; taken one interval at a time, idle would lose what the short ones read too
      little and the batches would get what the long ones read too much, overcharging
      requests by the counter's noise (seen on an H200 at low load). Carrying the
      balance both ways lets the next intervals even it out; ``idle_owed_out_uj`` is
      the balance after this interval;
    * the rest goes to the batches in proportion to their own clipped duration, and
      each batch share to its requests in proportion to work units.

    ``batches`` may contain batches that do not overlap the interval; they are
    ignored. Only a positive overlap counts as having run in the interval. The result
    does not depend on the order of ``batches``: they are sorted by
    ``(start_ns, end_ns, batch_id)`` before any split, which also fixes tie-breaking.
    """
    t0, t1 = start.t_ns, end.t_ns
    if t1 < t0:
        raise ValueError(f"interval ends before it starts: {t0} > {t1}")
    energy_uj = end.energy_uj - start.energy_uj
    if energy_uj < 0:
        raise ValueError(f"energy decreased over [{t0}, {t1}]: {start.energy_j} -> {end.energy_j}")
    power = _idle_power(idle_power_w)

    seen: set[str] = set()
    active: list[tuple[BatchRecord, int, int]] = []  # (batch, clipped lo, clipped hi)
    for batch in batches:
        if batch.batch_id in seen:
            raise ValueError(f"duplicate batch_id {batch.batch_id!r}")
        seen.add(batch.batch_id)
        lo, hi = max(batch.start_ns, t0), min(batch.end_ns, t1)
        if hi > lo:
            active.append((batch, lo, hi))
    active.sort(key=lambda a: (a[0].start_ns, a[0].end_ns, a[0].batch_id))

    busy_ns = _union_ns((lo, hi) for _, lo, hi in active)
    idle_ns = (t1 - t0) - busy_ns
    idle_estimate_uj = round(power * idle_ns / _NS_PER_UJ_AT_1W)
    idle_claim_uj = idle_estimate_uj + idle_owed_uj
    idle_uj = min(energy_uj, max(0, idle_claim_uj)) if active else energy_uj

    batch_shares = split_largest_remainder(energy_uj - idle_uj, [hi - lo for _, lo, hi in active])
    batch_parts: list[BatchPart] = []
    request_parts: list[RequestPart] = []
    for (batch, lo, hi), share in zip(active, batch_shares, strict=True):
        batch_parts.append(BatchPart(batch.batch_id, batch.model_name, batch.model_version, hi - lo, share))
        units = [work_units for _, work_units in batch.requests]
        # All-zero work units would leave the batch share with nowhere to go.
        weights = units if sum(units) > 0 else [1] * len(units)
        for (request_id, work_units), part in zip(
            batch.requests, split_largest_remainder(share, weights), strict=True
        ):
            request_parts.append(
                RequestPart(
                    batch.batch_id, request_id, batch.model_name, batch.model_version, work_units, part
                )
            )

    return IntervalAllocation(
        device_id=device_id,
        t0_ns=t0,
        t1_ns=t1,
        counter_start_j=start.energy_j,
        counter_end_j=end.energy_j,
        counter_start_uj=start.energy_uj,
        counter_end_uj=end.energy_uj,
        energy_uj=energy_uj,
        idle_uj=idle_uj,
        idle_estimate_uj=idle_estimate_uj,
        busy_ns=busy_ns,
        idle_ns=idle_ns,
        idle_power_w=float(idle_power_w),
        batch_parts=tuple(batch_parts),
        request_parts=tuple(request_parts),
        idle_owed_in_uj=idle_owed_uj,
        idle_owed_out_uj=idle_claim_uj - idle_uj,
    )


# --------------------------------------------------------------------------- streaming


@dataclass(frozen=True, slots=True)
class AccountantStats:
    """A consistent snapshot of an :class:`EnergyAccountant`'s state.

    ``allocated_until_ns`` is the allocation frontier: the end of the last allocated
    interval (or the first reading), ``None`` before any reading. ``held_intervals``
    are closed intervals waiting for in-flight batches. ``late_batches`` /
    ``late_ns`` count batches (and their time) reported after the interval they ran
    in had already been allocated; that time was charged to idle or other batches.
    Batch time before the first reading is not late, just unmetered.
    """

    allocated_until_ns: int | None
    pending_batches: int
    in_flight_batches: int
    held_intervals: int
    buffered_allocations: int
    late_batches: int
    late_ns: int


class EnergyAccountant:
    """Turns the readings and batches of one device into interval allocations.

    Thread-safe: batches come from model-instance threads and readings from a timer
    thread; one lock guards all state.

    *Readings* must not go back in time or energy (``ValueError``); meters handle
    counter wrap/reset before this point. A reading whose µJ value equals the
    previous one is dropped: meters update every 20-100 ms, so an unchanged value
    means "not updated yet", not "no energy". The interval then stretches to the
    next changed reading, and a short batch inside it still gets its share instead
    of sitting in a zero-energy interval.

    *Batches* are normally reported when they end (:meth:`add_batch`). An interval
    is allocated as soon as it is closed, so a batch that is still running when a
    reading closes an interval it overlaps would miss that interval. To prevent it,
    call :meth:`begin_batch` before the batch starts: closed intervals that may
    overlap an in-flight batch are held until it is added (or aborted with
    :meth:`abort_batch`). A batch added without ``begin_batch`` whose start lies
    before the allocation frontier loses the part before the frontier (counted in
    :meth:`stats` and logged) rather than raising in the model thread.

    Closed allocations are buffered, in time order, until :meth:`drain`.
    """

    def __init__(self, device_id: str, idle_power_w: float, idle_carry_s: float = 0.25) -> None:
        _idle_power(idle_power_w)  # validate early
        if not (math.isfinite(idle_carry_s) and idle_carry_s >= 0):
            raise ValueError(f"idle_carry_s must be a finite number >= 0, got {idle_carry_s!r}")
        self._device_id = device_id
        self._idle_power_w = float(idle_power_w)
        # The idle balance carried between intervals (see allocate_interval), at most the
        # interval's idle power x idle_carry_s either way when it is used: enough for a
        # counter's update lag (at most about 100 ms), while an idle power that is off or
        # has just changed cannot pile up a balance that skews batches for long. 0: each
        # interval alone, as before the carry existed.
        self._idle_carry_s = _exact(idle_carry_s, "idle_carry_s")
        self._idle_owed_uj = 0
        self._lock = threading.Lock()
        self._last_received: MeterReading | None = None
        self._first_t_ns: int | None = None
        # Start of the first unallocated interval; its t_ns is the frontier.
        self._open_start: MeterReading | None = None
        # Closed, not yet allocated interval ends, each with the idle power in force
        # when it closed (so a later set_idle_power_w does not rewrite the past).
        self._held: deque[tuple[MeterReading, float]] = deque()
        self._pending: dict[str, BatchRecord] = {}
        # batch_id -> earliest time the batch may start (None: unknown, hold all).
        self._in_flight: dict[str, int | None] = {}
        self._ready: list[IntervalAllocation] = []
        self._late_batches = 0
        self._late_ns = 0

    @property
    def device_id(self) -> str:
        return self._device_id

    @property
    def idle_power_w(self) -> float:
        with self._lock:
            return self._idle_power_w

    def set_idle_power_w(self, idle_power_w: float) -> None:
        """Change the idle power (e.g. once measured); applies to intervals closed from now on."""
        _idle_power(idle_power_w)
        with self._lock:
            self._idle_power_w = float(idle_power_w)

    def begin_batch(self, batch_id: str, start_ns: int | None = None) -> None:
        """Declare a batch as running (or about to run) before it is reported.

        ``start_ns`` is a lower bound of the batch start; intervals ending at or
        before it can still be allocated. Without it, the time of the latest
        reading is used, which is safe when this is called before the batch takes
        its start timestamp and readings are added after being timestamped.

        Every begun batch must end in :meth:`add_batch` or :meth:`abort_batch`;
        until then closed intervals accumulate (see ``held_intervals`` in
        :meth:`stats`).
        """
        with self._lock:
            if batch_id in self._in_flight or batch_id in self._pending:
                raise ValueError(f"batch_id {batch_id!r} already known")
            if start_ns is None and self._last_received is not None:
                start_ns = self._last_received.t_ns
            self._in_flight[batch_id] = start_ns

    def abort_batch(self, batch_id: str) -> None:
        """Forget an in-flight batch that will never be reported (e.g. it failed).

        Its time counts as idle. Unknown ids are ignored so that error paths can
        call this unconditionally.
        """
        with self._lock:
            if batch_id in self._in_flight:
                del self._in_flight[batch_id]
                self._allocate_ready()

    def add_batch(self, batch: BatchRecord) -> None:
        """Report a finished batch (completes a :meth:`begin_batch` with the same id).

        ``batch_id`` must be unique among batches not yet fully allocated
        (``ValueError`` otherwise); ids are forgotten once the frontier passes the
        batch end, to keep memory bounded.
        """
        late_ns = 0
        with self._lock:
            if batch.batch_id in self._pending:
                raise ValueError(f"duplicate batch_id {batch.batch_id!r}")
            self._in_flight.pop(batch.batch_id, None)
            frontier = self._open_start.t_ns if self._open_start is not None else None
            if frontier is not None and self._first_t_ns is not None:
                # Only time inside already allocated intervals is lost to reporting
                # order; time before the first reading was never metered at all.
                late_ns = max(0, min(batch.end_ns, frontier) - max(batch.start_ns, self._first_t_ns))
                if late_ns > 0:
                    self._late_batches += 1
                    self._late_ns += late_ns
            if frontier is None or batch.end_ns > frontier:
                self._pending[batch.batch_id] = batch
            self._allocate_ready()
        if late_ns > 0:
            logger.warning(
                "device %s: batch %s reported after %d ns of it were already allocated; "
                "call begin_batch() before running batches",
                self._device_id,
                batch.batch_id,
                late_ns,
            )

    def add_reading(self, t_ns: int, energy_j: float) -> None:
        """Add a cumulative counter reading; allocates every interval it makes ready."""
        reading = MeterReading(t_ns, energy_j)
        with self._lock:
            last = self._last_received
            if last is not None:
                if t_ns < last.t_ns:
                    raise ValueError(f"reading at {t_ns} ns is earlier than the last one at {last.t_ns} ns")
                if reading.energy_j < last.energy_j:
                    raise ValueError(f"energy decreased from {last.energy_j} J to {energy_j} J")
            self._last_received = reading
            if self._open_start is None:
                self._open_start = reading
                self._first_t_ns = t_ns
                self._retire()
                return
            tail = self._held[-1][0] if self._held else self._open_start
            if reading.energy_uj == tail.energy_uj:
                return  # meter not updated yet: keep the interval open (see class doc)
            self._held.append((reading, self._idle_power_w))
            self._allocate_ready()

    def drain(self) -> list[IntervalAllocation]:
        """Pop all allocations closed so far, oldest first."""
        with self._lock:
            ready, self._ready = self._ready, []
            return ready

    def stats(self) -> AccountantStats:
        with self._lock:
            return AccountantStats(
                allocated_until_ns=self._open_start.t_ns if self._open_start is not None else None,
                pending_batches=len(self._pending),
                in_flight_batches=len(self._in_flight),
                held_intervals=len(self._held),
                buffered_allocations=len(self._ready),
                late_batches=self._late_batches,
                late_ns=self._late_ns,
            )

    # Callers hold self._lock.

    def _allocate_ready(self) -> None:
        if self._open_start is None:
            return
        hold_from: int | None = None
        if self._in_flight:
            bounds = list(self._in_flight.values())
            if any(b is None for b in bounds):
                return
            hold_from = min(b for b in bounds if b is not None)
        while self._held:
            end, idle_power_w = self._held[0]
            # An interval ending at or before every in-flight start cannot overlap them.
            if hold_from is not None and end.t_ns > hold_from:
                break
            self._held.popleft()
            cap_uj = round(_idle_power(idle_power_w) * self._idle_carry_s * UJ_PER_J)
            allocation = allocate_interval(
                self._device_id,
                self._open_start,
                end,
                self._pending.values(),
                idle_power_w,
                max(-cap_uj, min(self._idle_owed_uj, cap_uj)),
            )
            # Clamped when kept too: a balance left while the idle power was 0 (the recorder learns it from
            # batch-free intervals, which at 0 W leave all they read as credit) must not reach the first
            # batch once a power is learned.
            self._idle_owed_uj = max(-cap_uj, min(allocation.idle_owed_out_uj, cap_uj))
            self._ready.append(allocation)
            self._open_start = end
            self._retire()

    def _retire(self) -> None:
        """Drop batches that end at or before the frontier: no future interval overlaps them."""
        assert self._open_start is not None
        frontier = self._open_start.t_ns
        done = [bid for bid, b in self._pending.items() if b.end_ns <= frontier]
        for bid in done:
            del self._pending[bid]
