"""Modelled CPU + memory energy of *this process*, for hosts with no NVML/RAPL.

Model::

    energy_J = cpu_seconds * tdp_w / cores  +  rss_GB * memory_w_per_gb * wall_seconds

* ``cpu_seconds`` comes from ``cpu_time_s``: by default the process's user +
  system CPU time, summed over all its threads; a gateway passes the CPU time
  of its serving work only (:mod:`inference.meters.serving_cpu`), so that the
  dashboard and the API it may host are not booked on the device. Either way
  only this process counts (not other workers on the host).
* ``tdp_w / cores`` is the power of one fully busy core at TDP. It ignores idle
  and uncore power, turbo above TDP and frequency scaling -- hence the 30 %
  nominal uncertainty, and the meter reports ``measured = False``.
* The memory term uses the resident set size, in decimal GB (1e9 bytes), and
  integrates it over wall time with the trapezoid rule between reads.
  The default 0.375 W/GB (3 W per 8 GB) is a common modelling figure for DRAM
  power; Green Algorithms (Lannelongue et al., 2021) uses a very similar
  0.3725 W/GB.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .base import ClockNs, Meter, MeterMethod
from .host import cpu_model_device_id
from .host import host_id as detect_host_id

DEFAULT_TDP_W = 65.0
DEFAULT_MEMORY_W_PER_GB = 0.375


def process_cpu_time_s() -> float:
    """User + system CPU seconds of this process (all threads)."""
    return time.process_time()


def process_rss_bytes() -> int:
    """Current resident set size of this process, in bytes.

    Reads ``/proc/self/statm`` on Linux. Elsewhere falls back to the *peak* RSS
    from ``getrusage``, which over-estimates the memory term.
    """
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    import resource  # POSIX only, so not imported at module level

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in bytes on macOS and kibibytes elsewhere.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


class CpuModelMeter(Meter):
    """Modelled energy of the current process (see module doc for the model).

    Args:
        tdp_w: CPU thermal design power in watts (whole package).
        cores: number of cores the TDP is shared by; ``None`` uses
            ``os.cpu_count()`` (logical CPUs, which undercounts per-core power
            on SMT machines -- pass physical cores if known).
        memory_w_per_gb: DRAM power per GB resident.
        host_id: the host (:mod:`inference.meters.host`); ``None`` detects it.
        instance: names the process on its host, for the device id: a gateway gives its ledger chain id (one
            live process at a time), so a restart keeps the device; ``None``: ``pid<pid>``.
        device_id: id reported in readings; ``None``: ``cpu-model:<host id>:<instance>``.
        cpu_time_s: CPU seconds to model (cumulative); default the whole process's.
        cpu_time_label: what ``cpu_time_s`` counts, for :meth:`device_info`.
        rss_bytes, clock_ns: injectable sources for tests.
    """

    def __init__(
        self,
        *,
        tdp_w: float = DEFAULT_TDP_W,
        cores: int | None = None,
        memory_w_per_gb: float = DEFAULT_MEMORY_W_PER_GB,
        host_id: str | None = None,
        instance: str | None = None,
        device_id: str | None = None,
        cpu_time_s: Callable[[], float] = process_cpu_time_s,
        cpu_time_label: str = "the whole process",
        rss_bytes: Callable[[], int] = process_rss_bytes,
        clock_ns: ClockNs = time.monotonic_ns,
    ) -> None:
        if cores is None:
            cores = os.cpu_count() or 1
        if tdp_w < 0 or memory_w_per_gb < 0:
            raise ValueError(f"tdp_w and memory_w_per_gb must be >= 0, got {tdp_w!r}, {memory_w_per_gb!r}")
        if cores < 1:
            raise ValueError(f"cores must be >= 1, got {cores!r}")
        self._tdp_w = tdp_w
        self._cores = cores
        self._memory_w_per_gb = memory_w_per_gb
        self._cpu_time_s = cpu_time_s
        self._cpu_time_label = cpu_time_label
        self._rss_bytes = rss_bytes
        self._energy_j = 0.0
        self._prev_cpu_s = 0.0
        self._prev_t_ns = 0
        self._prev_rss = 0
        self._host_id = detect_host_id(host_id)
        if device_id is None:
            device_id = cpu_model_device_id(self._host_id, instance or f"pid{os.getpid()}")
        super().__init__(device_id, clock_ns=clock_ns)

    @property
    def method(self) -> MeterMethod:
        return "modelled"

    @property
    def watts_per_busy_core(self) -> float:
        return self._tdp_w / self._cores

    def device_info(self) -> dict[str, str]:
        return {
            "model": "cpu-time x tdp_w/cores + process rss x memory_w_per_gb x wall-time",
            "host_id": self._host_id,
            "tdp_w": f"{self._tdp_w:g}",
            "cores": str(self._cores),
            "memory_w_per_gb": f"{self._memory_w_per_gb:g}",
            "cpu_time": self._cpu_time_label,
        }

    def _start(self) -> None:
        self._energy_j = 0.0
        self._prev_cpu_s = self._cpu_time_s()
        self._prev_rss = self._rss_bytes()
        self._prev_t_ns = self._clock_ns()

    def _read(self) -> tuple[float, int]:
        cpu_s = self._cpu_time_s()
        rss = self._rss_bytes()
        t_ns = self._clock_ns()
        cpu_j = max(0.0, cpu_s - self._prev_cpu_s) * self.watts_per_busy_core
        mean_rss_gb = (self._prev_rss + rss) / 2.0 / 1e9
        wall_s = max(0, t_ns - self._prev_t_ns) / 1e9
        self._energy_j += cpu_j + mean_rss_gb * self._memory_w_per_gb * wall_s
        self._prev_cpu_s = max(cpu_s, self._prev_cpu_s)
        self._prev_rss = rss
        self._prev_t_ns = max(t_ns, self._prev_t_ns)
        return self._energy_j, t_ns
