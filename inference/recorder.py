"""Per-request energy on the hot path: meters, the accountant per device, and the spool.

Framework-free. The recorder is a batch hook: on the instance thread it spools every executed
batch and its requests (one ``os.write``) *before* any answer is delivered, hands the batch to
its device's accountant, and stamps each request with its ledger id. A timer thread reads
every meter about once a second (and batch ends read it too when the last reading is older
than ``boundary_min_interval_s``), closes intervals, and spools each interval, its idle line
and each batch's share with its split over the batch's requests. Nothing here touches the
database: the ledger writer drains the spool (ledger/writer.py).
"""

from __future__ import annotations

import itertools
import logging
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from inference.allocation import BatchRecord, EnergyAccountant, IntervalAllocation
from inference.batcher import BatchTiming, Pending
from inference.config import ModelSpec
from inference.efficiency import EfficiencyPlanner
from inference.errors import THREAD_ERRORS, InferenceError, ThreadErrors
from inference.meters import Meter
from inference.metrics import EnergyMetrics
from inference.repository import ModelVersion
from inference.spool import Spool, SpoolFull

log = logging.getLogger(__name__)


class LedgerUnavailable(InferenceError):
    """The spool is full (the database has been unreachable for long): refuse rather than answer unrecorded."""

    status = 503
    reason = "REJECTED"


@dataclass
class RecorderOptions:
    sample_interval_s: float = 1.0
    boundary_min_interval_s: float = 0.05
    flush_interval_s: float = 0.1
    idle_power_w: float | None = None  # declared for every device; None: learned from batch-free intervals
    min_idle_learning_s: float = 0.5
    # The idle balance intervals leave (uncharged idle energy, or idle charged beyond its estimate) is carried
    # to the next ones up to idle power x this many seconds either way (inference/allocation.py).
    idle_carry_s: float = 0.25


IDLE_SAMPLES = 9  # batch-free intervals the learned idle power is the median of


class DeviceAccount:
    def __init__(
        self, meter: Meter, reason: str, declared_idle_w: float | None, idle_carry_s: float = 0.25
    ) -> None:
        self.meter = meter
        self.reason = reason
        self.device_id = meter.device_id
        self.declared_idle_w = declared_idle_w
        self.accountant = EnergyAccountant(meter.device_id, declared_idle_w or 0.0, idle_carry_s)
        self.last_read_ns = 0
        self.read_lock = threading.Lock()  # readings must reach the accountant in time order
        self.learned_idle_w: float | None = None
        self.idle_samples_w: deque[float] = deque(maxlen=IDLE_SAMPLES)

    @property
    def kind(self) -> str:
        return "gpu" if self.meter.method.startswith("nvml") or self.meter.method == "triton" else "cpu"


def work_units(spec: ModelSpec, p: Pending) -> int:
    """How a batch's energy is shared among its requests: elements (default), rows, or tokens."""
    mode = spec.parameters.get("work_units", "elements")
    inputs: dict[str, np.ndarray[Any, Any]] = p.payload.inputs
    if mode == "rows":
        return int(p.rows)
    if mode == "tokens":
        name = spec.parameters.get("work_units_input", "")
        arr = inputs.get(name)
        if arr is not None and arr.dtype != object:
            return int(np.count_nonzero(arr)) or int(p.rows)
        return int(p.rows)
    return int(sum(a.size for a in inputs.values())) or int(p.rows)


class LedgerRecorder:
    def __init__(
        self,
        spool: Spool,
        meters: list[tuple[Meter, str]],
        options: RecorderOptions | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        wall_ns: Callable[[], int] = time.time_ns,
        thread_errors: ThreadErrors = THREAD_ERRORS,
        energy_metrics: EnergyMetrics | None = None,
    ) -> None:
        """``energy_metrics``: the /metrics counters each closed interval is added to (on the meter thread)."""
        if not meters:
            raise ValueError("the recorder needs at least one meter")
        self.spool = spool
        self.energy_metrics = energy_metrics
        self.options = options or RecorderOptions()
        self._wall_offset = wall_ns() - clock_ns()
        self.devices = [
            DeviceAccount(m, why, self.options.idle_power_w, self.options.idle_carry_s) for m, why in meters
        ]
        # Ids unique across restarts of the same chain: a per-process boot token.
        self._prefix = f"{spool.chain_id[:8]}.{os.urandom(3).hex()}"
        self._request_ids = itertools.count(1)
        self._batch_ids = itertools.count(1)
        self._interval_ids = itertools.count(1)
        self._batch_end: dict[str, int] = {}
        # Batches whose energy feeds a batcher's efficiency planner: id -> (planner, rows, µJ so far).
        self._planned: dict[str, tuple[EfficiencyPlanner, int, int]] = {}
        self._batch_end_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Interval lines the spool refused (full): kept, in order, and written first next time.
        self._unspooled: list[bytes] = []
        self._unspooled_lock = threading.Lock()
        self._thread_errors = thread_errors
        # The meter thread's schedule (set when it starts).
        self._next_sample = 0.0
        self._next_sync = 0.0
        self._full_logged = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        lines = []
        for dev in self.devices:
            dev.meter.start()
            info = dev.meter.device_info()
            log.info("energy meter for %s: %s (%s)", dev.device_id, dev.meter.method, dev.reason)
            lines.append(
                orjson.dumps(
                    {
                        "k": "device",
                        "device_id": dev.device_id,
                        "kind": dev.kind,
                        "name": info.get("name", dev.device_id),
                        "method": dev.meter.method,
                        "measured": dev.meter.measured,
                        "relative_uncertainty": dev.meter.relative_uncertainty,
                        "info": {**info, "reason": dev.reason},
                    }
                )
                + b"\n"
            )
            self._read(dev)
        try:
            self._spool_or_keep(lines)
        except SpoolFull:
            log.warning("ledger spool full at start-up: device records wait in memory until it drains")
        self._thread = threading.Thread(target=self._run, name="energy-meter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close the last interval of every device and spool it, then stop the meters."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for dev in self.devices:
            try:
                self._read(dev)
            except Exception:
                log.exception("final reading of %s failed", dev.device_id)
        # The drainer (another process) still runs: give it a few seconds to make room.
        for _ in range(100):
            self.spool.sync_acknowledged()
            try:
                self._flush()
                break
            except SpoolFull:
                time.sleep(0.1)
        else:
            log.error(
                "ledger spool full at shutdown: %d interval lines could not be spooled and are lost",
                len(self._unspooled),
            )
        for dev in self.devices:
            try:
                dev.meter.close()
            except Exception:
                log.exception("closing the meter of %s failed", dev.device_id)

    def admit(self) -> None:
        """Refuse new requests while the spool is full: answers must never go unrecorded."""
        if not self.spool.would_accept(4096):
            raise LedgerUnavailable(
                f"the ledger spool is full ({self.spool.backlog_bytes} bytes wait for the database); "
                "requests are refused until it drains"
            )

    # -- device choice -----------------------------------------------------------------------

    def device_for(self, spec: ModelSpec) -> DeviceAccount:
        wanted = spec.parameters.get("device", "")
        if wanted:
            for dev in self.devices:
                if dev.device_id == wanted:
                    return dev
            log.warning(
                "model %s asks for device %r, which has no meter; using the default", spec.name, wanted
            )
        groups = spec.config_dict.get("instance_group", [])
        if any(g.get("kind", "KIND_CPU") == "KIND_GPU" for g in groups):
            gpus = [dev for dev in self.devices if dev.kind == "gpu"]
            # The GPU the first KIND_GPU group names (its NVML index), else the first metered GPU. A model whose
            # instances span several GPUs is charged to that one: one gateway per GPU is the policy.
            named = [str(i) for g in groups if g.get("kind") == "KIND_GPU" for i in g.get("gpus", [])]
            for dev in gpus:
                if named and dev.meter.device_info().get("index") == named[0]:
                    return dev
            if gpus:
                return gpus[0]
        for dev in self.devices:
            if dev.kind == "cpu":
                return dev
        return self.devices[0]

    def hook_for(self, mv: ModelVersion) -> _BatchHook:
        device = self.device_for(mv.spec)
        if self.energy_metrics is not None:
            self.energy_metrics.declare(mv.spec.name, mv.version, device.device_id)
        return _BatchHook(self, mv, device)

    # -- internals ---------------------------------------------------------------------------

    def wall(self, mono_ns: int) -> int:
        return mono_ns + self._wall_offset

    def new_batch_id(self) -> str:
        return f"{self._prefix}.b{next(self._batch_ids)}"

    def new_request_id(self) -> str:
        return f"{self._prefix}.r{next(self._request_ids)}"

    def _read(self, dev: DeviceAccount) -> None:
        with dev.read_lock:
            reading = dev.meter.read()
            dev.accountant.add_reading(reading.t_ns, reading.energy_j)
            dev.last_read_ns = reading.t_ns

    def maybe_read(self, dev: DeviceAccount, now_ns: int) -> None:
        if now_ns - dev.last_read_ns >= self.options.boundary_min_interval_s * 1e9:
            try:
                self._read(dev)
            except Exception as exc:  # at a batch's end, on its instance thread: the batch is still recorded
                self._thread_errors.record(
                    exc,
                    f"reading the meter of {dev.device_id} at a batch's end failed; the next reading retries",
                )

    def _run(self) -> None:
        # Closed intervals are spooled every flush_interval_s, not once per sample: turning an
        # interval into lines holds the GIL for about 5 µs per request, and one big burst a
        # second shows up in the event loop's tail latency.
        tick = min(self.options.flush_interval_s, self.options.sample_interval_s)
        self._next_sample = time.monotonic() + self.options.sample_interval_s
        self._next_sync = 0.0
        self._full_logged = False
        while not self._stop.wait(tick):
            try:
                self._tick()
            except Exception as exc:  # the thread goes on: without it no interval is ever spooled again
                self._thread_errors.record(exc, "an iteration of the energy meter thread failed; it goes on")

    def _tick(self) -> None:
        """One turn of the meter thread; each step's failure is counted and logged once, and the next goes on."""
        now = time.monotonic()
        if now >= self._next_sync:
            self._next_sync = now + 0.25
            try:
                self.spool.sync_acknowledged()  # a drainer in another process frees space
            except Exception as exc:
                self._thread_errors.record(
                    exc, "reading the drainer's acknowledged position failed; retrying"
                )
        if now >= self._next_sample:
            self._next_sample = now + self.options.sample_interval_s
            for dev in self.devices:
                try:
                    self._read(dev)
                except Exception as exc:
                    self._thread_errors.record(
                        exc, f"reading the meter of {dev.device_id} failed; the next sample retries"
                    )
        try:
            self._flush()
            self._full_logged = False
        except SpoolFull:
            if not self._full_logged:
                log.error("ledger spool full: closed intervals wait in memory until it drains")
                self._full_logged = True
        except Exception as exc:
            self._thread_errors.record(exc, "spooling closed intervals failed; they are kept and retried")

    def _flush(self) -> None:
        lines: list[bytes] = []
        metrics = self.energy_metrics
        for dev in self.devices:
            for alloc in dev.accountant.drain():
                lines.extend(self._interval_lines(dev, alloc))
                if metrics is not None:  # here, outside the locks the batches' hooks take
                    metrics.add_interval(dev.device_id, alloc)
        self._spool_or_keep(lines)

    def _spool_or_keep(self, lines: list[bytes]) -> None:
        """Append ``lines`` after any kept earlier; if the spool is full, keep them all for later.

        Measured energy is never dropped: it waits in memory (small: a few lines per device
        and second) until the database drains the spool.
        """
        with self._unspooled_lock:
            pending = self._unspooled + lines
            if not pending:
                return
            try:
                self.spool.append(b"".join(pending))
            except SpoolFull:
                self._unspooled = pending
                raise
            self._unspooled = []

    def _interval_lines(self, dev: DeviceAccount, a: IntervalAllocation) -> list[bytes]:
        iid = f"{self._prefix}.i{next(self._interval_ids)}"
        t0, t1 = self.wall(a.t0_ns), self.wall(a.t1_ns)
        out = [
            orjson.dumps(
                {
                    "k": "interval",
                    "interval_id": iid,
                    "device_id": dev.device_id,
                    "method": dev.meter.method,
                    "relative_uncertainty": dev.meter.relative_uncertainty,
                    "t0_ns": t0,
                    "t1_ns": t1,
                    "counter_start_j": a.counter_start_j,
                    "counter_end_j": a.counter_end_j,
                    "energy_uj": a.energy_uj,
                    "idle_uj": a.idle_uj,
                    "busy_ns": a.busy_ns,
                    "idle_ns": a.idle_ns,
                }
            ),
            orjson.dumps(
                {
                    "k": "idle",
                    "interval_id": iid,
                    "device_id": dev.device_id,
                    "t0_ns": t0,
                    "t1_ns": t1,
                    "energy_uj": a.idle_uj,
                    "idle_ns": a.idle_ns,
                    "idle_power_w": a.idle_power_w,
                    "owed_in_uj": a.idle_owed_in_uj,
                }
            ),
        ]
        # One line per batch with its requests' shares, not one per request: at the batch sizes of a loaded
        # gateway that is a sixteenth of the lines to write here and of the rows for the ledger writer.
        splits: dict[str, tuple[list[str], list[int]]] = {}
        for part in a.request_parts:
            split = splits.get(part.batch_id)
            if split is None:
                split = splits[part.batch_id] = ([], [])
            split[0].append(part.request_id)
            split[1].append(part.energy_uj)
        with self._batch_end_lock:
            for bp in a.batch_parts:
                end = self._batch_end.get(bp.batch_id)
                final = end is not None and end <= a.t1_ns
                ids, shares = splits.get(bp.batch_id, ([], []))
                out.append(
                    orjson.dumps(
                        {
                            "k": "batch_energy",
                            "batch_id": bp.batch_id,
                            "interval_id": iid,
                            "energy_uj": bp.energy_uj,
                            "request_ids": ids,
                            "shares_uj": shares,
                            "final": final,
                        }
                    )
                )
                planned = self._planned.get(bp.batch_id)
                if planned is not None:
                    planned = (planned[0], planned[1], planned[2] + bp.energy_uj)
                    self._planned[bp.batch_id] = planned
                if final:
                    del self._batch_end[bp.batch_id]
                    if planned is not None:
                        # The batch's whole share is known: the accountant's measurement teaches the planner.
                        del self._planned[bp.batch_id]
                        planned[0].batch_energy(planned[1], planned[2] / 1e6)
        self._learn_idle(dev, a)
        return [line + b"\n" for line in out]

    def _learn_idle(self, dev: DeviceAccount, a: IntervalAllocation) -> None:
        """Measured idle power: the median power of the last ``IDLE_SAMPLES`` intervals in which the device ran
        no batch.

        A median, not an average: the first such interval holds the gateway's own start-up (5.0 W against an
        idle 0.18 W for the ``cpu-model`` meter on ``make run``), and the average this replaced (0.8 old +
        0.2 new) carried it for about 15 s, charging idle more than was there and requests nothing."""
        if (
            dev.declared_idle_w is not None
            or a.busy_ns
            or a.duration_ns < self.options.min_idle_learning_s * 1e9
        ):
            return
        watts = a.energy_uj / 1e6 / (a.duration_ns / 1e9)
        dev.idle_samples_w.append(watts)
        dev.learned_idle_w = statistics.median(dev.idle_samples_w)
        dev.accountant.set_idle_power_w(dev.learned_idle_w)


class _BatchHook:
    """The recorder's hook on one model version's batcher."""

    def __init__(self, recorder: LedgerRecorder, mv: ModelVersion, device: DeviceAccount) -> None:
        self.recorder = recorder
        self.mv = mv
        self.device = device
        self.spec = mv.spec
        self._current: dict[int, str] = {}  # batch id per instance thread, begin -> end

    def begin(self, index: int, batch: list[Pending]) -> None:
        batch_id = self.recorder.new_batch_id()
        self._current[index] = batch_id
        self.device.accountant.begin_batch(batch_id)

    def end(self, index: int, batch: list[Pending], timing: BatchTiming, error: BaseException | None) -> None:
        rec = self.recorder
        batch_id = self._current.pop(index)
        spec = self.spec
        status = "ok" if error is None else "error"
        wall = rec.wall
        started, finished = wall(timing.start_ns), wall(timing.end_ns)
        device_id = self.device.device_id
        rows = sum(p.rows for p in batch)
        lines = [
            orjson.dumps(
                {
                    "k": "batch",
                    "batch_id": batch_id,
                    "model": spec.name,
                    "version": self.mv.version,
                    "device_id": device_id,
                    "instance": index,
                    "start_ns": started,
                    "end_ns": finished,
                    "requests": len(batch),
                    "rows": rows,
                    "status": status,
                    "variant": batch[0].variant if batch else "",
                }
            )
        ]
        work: list[tuple[str, int]] = []
        compute_ns = timing.end_ns - timing.start_ns
        for p in batch:
            call = p.payload
            request_id = rec.new_request_id()
            units = work_units(spec, p)
            principal = call.principal
            lines.append(
                orjson.dumps(
                    {
                        "k": "req",
                        "request_id": request_id,
                        "client_request_id": call.request.id or "",
                        "organization_id": principal.organization_id if principal is not None else None,
                        "api_key_id": principal.key_id if principal is not None else None,
                        "model": spec.name,
                        "version": self.mv.version,
                        "batch_id": batch_id,
                        "device_id": device_id,
                        "received_ns": wall(call.received_ns),
                        "started_ns": started,
                        "finished_ns": finished,
                        "queue_ns": timing.start_ns - p.enqueued_ns,
                        "compute_ns": compute_ns,
                        "work_units": units,
                        "status": status,
                        "variant": p.variant,
                    }
                )
            )
            work.append((request_id, units))
            call.ledger_id = request_id
        try:
            rec.spool.append(b"\n".join(lines) + b"\n")
        except SpoolFull as exc:
            self.device.accountant.abort_batch(batch_id)
            raise LedgerUnavailable(
                f"the ledger spool is full; the batch of model '{spec.name}' was not recorded"
            ) from exc
        planner = self.mv.batcher.planner if self.mv.batcher is not None else None
        with rec._batch_end_lock:
            rec._batch_end[batch_id] = timing.end_ns
            if planner is not None and error is None:
                rec._planned[batch_id] = (planner, rows, 0)
        self.device.accountant.add_batch(
            BatchRecord(batch_id, timing.start_ns, timing.end_ns, work, spec.name, self.mv.version)
        )
        rec.maybe_read(self.device, timing.end_ns)
