"""Prometheus lines the gateway adds to Triton's: energy and location-based CO2e per model, the spool and its
drainer, the key store. Framework-free; the Django side (carbonledger/gateway_app.py) feeds what only it knows
(the grid intensity, the drainer process's state) through these objects.

Nothing here runs per request. The energy counters are written by the recorder's meter thread once per closed
metering interval, the drain lag is sampled by a status thread, and a scrape reads snapshots taken under short
locks.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from inference.allocation import IntervalAllocation
from inference.stats import prometheus_label

# µJ -> kWh: 1 kWh = 3.6e6 J = 3.6e12 µJ.
_UJ_PER_KWH = 3.6e12


def _num(value: float) -> str:
    """A sample value: integers as such, other floats in their shortest exact form."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def family(name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    """One metric family: HELP, TYPE and its samples, each (label text without braces, value)."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        lines.append(f"{name}{{{labels}}} {_num(value)}" if labels else f"{name} {_num(value)}")
    return lines


def labels(**pairs: str) -> str:
    return ",".join(f'{k}="{prometheus_label(v)}"' for k, v in pairs.items())


class EnergyMetrics:
    """Energy per model and device, in joules, and its location-based CO2e in grams, as Prometheus counters.

    Location-based: each closed interval's energy x the site's PUE x the grid intensity of the site's zone at
    the time the interval closed (``set_intensity``, refreshed by the Django side the way the carbon-aware mode
    reads it). An estimate for dashboards and alerts: the inventory's figures are the ledger's hourly rollups,
    which pick the factor of each hour. Energy closed while no intensity is known is counted apart
    (``carbonledger_co2e_location_unpriced_joules_total``), never priced at a guess.

    Energies are kept in integer µJ, as the ledger keeps them, so a counter equals the sum of the spooled parts.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._model_uj: dict[tuple[str, str, str], int] = {}
        self._model_co2e_g: dict[tuple[str, str, str], float] = {}
        self._device_uj: dict[str, int] = {}
        self._idle_uj: dict[str, int] = {}
        self._idle_co2e_g: dict[str, float] = {}
        self._unpriced_uj = 0
        self._intensity_g_per_kwh: float | None = None
        self._pue = 1.0
        self._zone = ""

    def set_intensity(self, *, intensity_g_per_kwh: float | None, pue: float, zone: str) -> None:
        """The grid intensity (None: unknown) and PUE that price the intervals closed from now on."""
        with self._lock:
            self._intensity_g_per_kwh = intensity_g_per_kwh
            self._pue = pue
            self._zone = zone

    def declare(self, model: str, version: str, device_id: str) -> None:
        """A model version served on a device: its counters show from 0 before its first interval closes."""
        key = (model, version, device_id)
        with self._lock:
            self._model_uj.setdefault(key, 0)
            self._model_co2e_g.setdefault(key, 0.0)
            self._device_uj.setdefault(device_id, 0)
            self._idle_uj.setdefault(device_id, 0)
            self._idle_co2e_g.setdefault(device_id, 0.0)

    def add_interval(self, device_id: str, allocation: IntervalAllocation) -> None:
        """One closed metering interval of ``device_id``: its batches' shares by model, and its idle energy.
        Called on the meter thread, outside every lock the batches take."""
        with self._lock:
            intensity = self._intensity_g_per_kwh
            g_per_uj = None if intensity is None else intensity * self._pue / _UJ_PER_KWH
            self._device_uj[device_id] = self._device_uj.get(device_id, 0) + allocation.energy_uj
            self._idle_uj[device_id] = self._idle_uj.get(device_id, 0) + allocation.idle_uj
            if g_per_uj is None:
                self._unpriced_uj += allocation.energy_uj
            else:
                self._idle_co2e_g[device_id] = (
                    self._idle_co2e_g.get(device_id, 0.0) + allocation.idle_uj * g_per_uj
                )
            for part in allocation.batch_parts:
                key = (part.model_name, part.model_version, device_id)
                self._model_uj[key] = self._model_uj.get(key, 0) + part.energy_uj
                co2e = self._model_co2e_g.get(key, 0.0)
                self._model_co2e_g[key] = co2e + part.energy_uj * g_per_uj if g_per_uj is not None else co2e

    def prometheus_lines(self) -> list[str]:
        with self._lock:
            model_uj = sorted(self._model_uj.items())
            model_co2e = sorted(self._model_co2e_g.items())
            device_uj = sorted(self._device_uj.items())
            idle_uj = sorted(self._idle_uj.items())
            idle_co2e = sorted(self._idle_co2e_g.items())
            unpriced_uj = self._unpriced_uj
            intensity, pue, zone = self._intensity_g_per_kwh, self._pue, self._zone

        def by_model(
            items: Sequence[tuple[tuple[str, str, str], float]], scale: float
        ) -> list[tuple[str, float]]:
            return [(labels(model=m, version=v, device=d), value / scale) for (m, v, d), value in items]

        def by_device(items: Sequence[tuple[str, float]], scale: float) -> list[tuple[str, float]]:
            return [(labels(device=d), value / scale) for d, value in items]

        return [
            *family(
                "carbonledger_inference_energy_joules_total",
                "counter",
                "Energy the ledger allocated to a model's batches on a device, in joules (each request's share "
                "is in the ledger)",
                by_model(model_uj, 1e6),
            ),
            *family(
                "carbonledger_inference_co2e_location_grams_total",
                "counter",
                "Location-based CO2e of that energy in grams: energy x site PUE x the grid intensity of the "
                "site's zone when its metering interval closed (an estimate; the ledger's hourly rollups are the "
                "inventory)",
                by_model(model_co2e, 1.0),
            ),
            *family(
                "carbonledger_device_energy_joules_total",
                "counter",
                "Energy metered on a device, in joules: the models' shares plus its idle energy",
                by_device(device_uj, 1e6),
            ),
            *family(
                "carbonledger_device_idle_energy_joules_total",
                "counter",
                "Energy of a device charged to idle (no batch to carry it), in joules",
                by_device(idle_uj, 1e6),
            ),
            *family(
                "carbonledger_device_idle_co2e_location_grams_total",
                "counter",
                "Location-based CO2e of a device's idle energy in grams (as the models' counter)",
                by_device(idle_co2e, 1.0),
            ),
            *family(
                "carbonledger_co2e_location_unpriced_joules_total",
                "counter",
                "Energy metered while no grid intensity was known for the site's zone, in joules: left out of "
                "the CO2e counters",
                [("", unpriced_uj / 1e6)],
            ),
            *family(
                "carbonledger_co2e_location_intensity_g_per_kwh",
                "gauge",
                "Grid intensity (gCO2e/kWh) the CO2e counters price energy at now: the site's zone's, read as "
                "the carbon-aware mode reads it (the configured provider's forecast, else the hourly or annual "
                "figure); absent while unknown",
                [] if intensity is None else [(labels(zone=zone), intensity)],
            ),
            *family("carbonledger_site_pue", "gauge", "PUE of the gateway's site", [("", pue)]),
        ]


class DrainLag:
    """How long the oldest spooled record not yet in the database has waited: the drainer's lag.

    ``sample`` is called every fraction of a second with the spool's ``drain_totals()`` (bytes appended so far,
    backlog). It remembers when each amount of bytes had been appended; the oldest record still waiting was
    appended after the last sample whose bytes are all acknowledged, so the lag is the time since that sample
    (to within the sampling period). Zero when nothing waits. A drainer that stopped, hung or loops on one
    record lets it grow, whatever the reason.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_samples: int = 4096) -> None:
        self._clock = clock
        self._max_samples = max_samples
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, int]] = deque()  # (when, bytes appended by then), rising
        self._anchor = clock()  # everything appended by then is acknowledged (or it is when sampling began)
        self._waiting = False

    def sample(self, appended: int, backlog: int) -> float:
        """Record the spool's totals now; returns the lag in seconds."""
        now = self._clock()
        acknowledged = appended - backlog
        with self._lock:
            if backlog <= 0:
                self._samples.clear()
                self._anchor = now
                self._waiting = False
                return 0.0
            self._waiting = True
            if not self._samples or appended > self._samples[-1][1]:
                if len(self._samples) >= self._max_samples:
                    # Thin out the oldest half: the lag loses resolution far back, never its start.
                    kept = list(self._samples)[::2]
                    self._samples = deque(kept)
                self._samples.append((now, appended))
            while self._samples and self._samples[0][1] <= acknowledged:
                self._anchor = self._samples.popleft()[0]
            return now - self._anchor

    def seconds(self) -> float:
        """The lag as of now, from the last sample's state (growing while records wait)."""
        with self._lock:
            return self._clock() - self._anchor if self._waiting else 0.0


@dataclass(frozen=True)
class DrainerState:
    """What the gateway knows of its ledger drainer (a process of its own, or a thread)."""

    chain: str
    up: bool
    restarts: int
    records_written: int
    healthy: bool | None  # its last drain attempt succeeded (None: not known yet)
    lag_s: float
    backlog_bytes: int
    max_backlog_bytes: int


def drainer_lines(state: DrainerState | None) -> list[str]:
    """The spool's and the drainer's state, labelled with the chain the drainer writes (one per replica)."""
    if state is None:
        return []
    chain = labels(chain=state.chain)
    lines = [
        *family(
            "carbonledger_spool_backlog_bytes",
            "gauge",
            "Bytes spooled and not yet in the database",
            [(chain, state.backlog_bytes)],
        ),
        *family(
            "carbonledger_spool_max_bytes",
            "gauge",
            "The spool's cap (SPOOL_MAX_BYTES): at it, infer requests are refused with 503",
            [(chain, state.max_backlog_bytes)],
        ),
        *family(
            "carbonledger_ledger_drain_lag_seconds",
            "gauge",
            "How long the oldest spooled record not yet in the database has waited (0 when none waits)",
            [(chain, round(state.lag_s, 3))],
        ),
        *family(
            "carbonledger_ledger_drainer_up",
            "gauge",
            "1 while this gateway's ledger drainer (process or thread) is alive",
            [(chain, 1 if state.up else 0)],
        ),
        *family(
            "carbonledger_ledger_drainer_restarts_total",
            "counter",
            "Times the drainer process was found dead and started again",
            [(chain, state.restarts)],
        ),
        *family(
            "carbonledger_ledger_records_written_total",
            "counter",
            "Ledger records (quarantine markers included) the drainer committed since the gateway started",
            [(chain, state.records_written)],
        ),
    ]
    if state.healthy is not None:
        lines += family(
            "carbonledger_ledger_drainer_healthy",
            "gauge",
            "1 when the drainer's last attempt to write succeeded; 0 while it waits for the database or retries "
            "a failure (its log says which)",
            [(chain, 1 if state.healthy else 0)],
        )
    return lines


KEY_STORE_OUTCOMES = ("stale_answer", "refused")


def key_store_lines(errors: dict[str, int]) -> list[str]:
    """``carbonledger_key_store_errors_total``: key lookups the key store failed, by what the gateway did."""
    return family(
        "carbonledger_key_store_errors_total",
        "counter",
        "API key lookups the key store (the database) failed, by what the gateway did instead: served the key's "
        "last answer (stale_answer) or refused the request with 503 (refused)",
        [(labels(outcome=o), errors.get(o, 0)) for o in KEY_STORE_OUTCOMES],
    )
