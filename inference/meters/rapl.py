"""CPU package (and DRAM) energy from Linux powercap RAPL sysfs files.

Layout (``/sys/class/powercap`` by default)::

    intel-rapl:0/name                  "package-0"
    intel-rapl:0/energy_uj             cumulative microjoules, wraps around
    intel-rapl:0/max_energy_range_uj   value at which energy_uj wraps to 0
    intel-rapl:0/intel-rapl:0:0/name   "core" | "uncore" | "dram" | ...

AMD Zen parts are exposed under the same ``intel-rapl`` names. Only the
``intel-rapl:N`` package zones and their ``dram`` subzones are used: "core"
and "uncore" are already included in the package, and ``intel-rapl-mmio``
zones duplicate the package on the platforms that have them.

Wrap-around: ``energy_uj`` is a 32-bit hardware counter scaled to microjoules
and wraps every ``max_energy_range_uj`` (typically 262143 J for a package, i.e.
~20 min at 200 W, less on bigger CPUs). The meter assumes at most one wrap
between two reads -- more cannot be told apart from the values -- so a meter
must be read at least once per wrap period; ``poll_interval_s`` makes the meter
do that itself on a background thread. (Strictly the counter wraps one energy
unit after ``max_energy_range_uj``; the ~60 uJ per wrap this ignores is far
below the measurement error.)

Permissions: since Linux 5.10 (the "Platypus" side channel, CVE-2020-8694)
``energy_uj`` is readable by root only on most distributions.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .base import ClockNs, CounterAccumulator, Meter, MeterError, MeterMethod, PeriodicThread
from .host import host_id as detect_host_id
from .host import rapl_device_id

DEFAULT_POWERCAP_ROOT = Path("/sys/class/powercap")

_PACKAGE_ZONE = re.compile(r"^intel-rapl:(\d+)$")
_SUB_ZONE = re.compile(r"^intel-rapl:(\d+):(\d+)$")

ReadText = Callable[[Path], str]


def _read_text(path: Path) -> str:
    return path.read_text(encoding="ascii")


@dataclass(frozen=True, slots=True)
class RaplZone:
    """One powercap zone directory: a package or one of its sub-zones."""

    path: Path
    name: str

    @property
    def energy_file(self) -> Path:
        return self.path / "energy_uj"

    @property
    def max_range_file(self) -> Path:
        return self.path / "max_energy_range_uj"


@dataclass(frozen=True, slots=True)
class RaplPackage:
    """A CPU package zone and, where the platform exposes one, its DRAM sub-zone."""

    number: int
    zone: RaplZone
    dram: RaplZone | None


def _read_file(read_text: ReadText, path: Path) -> str:
    """Read a sysfs file, turning OS errors into a MeterError that names the file."""
    try:
        return read_text(path).strip()
    except PermissionError as exc:
        raise MeterError(
            f"rapl: cannot read {path}: permission denied. Since Linux 5.10 (CVE-2020-8694) RAPL "
            "energy files are readable by root only; run as root or grant read access to this file "
            "(e.g. a udev rule or 'chmod a+r')."
        ) from exc
    except FileNotFoundError as exc:
        raise MeterError(f"rapl: {path} not present") from exc
    except OSError as exc:
        raise MeterError(f"rapl: cannot read {path}: {exc}") from exc


def _read_int(read_text: ReadText, path: Path) -> int:
    text = _read_file(read_text, path)
    try:
        return int(text)
    except ValueError as exc:
        raise MeterError(f"rapl: {path} does not hold an integer: {text!r}") from exc


def find_packages(
    root: str | Path = DEFAULT_POWERCAP_ROOT, *, read_text: ReadText = _read_text
) -> list[RaplPackage]:
    """List RAPL package zones under ``root``, sorted by package number.

    Raises :class:`MeterError` when ``root`` does not exist or holds no
    ``intel-rapl:N`` package zone (the message names what was missing).
    """
    root = Path(root)
    if not root.is_dir():
        raise MeterError(
            f"rapl: {root / 'intel-rapl:0'} not present ({root} does not exist: no powercap support)"
        )
    packages: list[RaplPackage] = []
    for entry in sorted(root.iterdir()):
        match = _PACKAGE_ZONE.match(entry.name)
        if match is None:
            continue
        name = _read_file(read_text, entry / "name")
        if not name.startswith("package"):
            # e.g. "psys" (platform) zones on some laptops: not a CPU package.
            continue
        dram: RaplZone | None = None
        for sub in sorted(entry.iterdir()):
            if _SUB_ZONE.match(sub.name) and _read_file(read_text, sub / "name") == "dram":
                dram = RaplZone(sub, "dram")
                break
        packages.append(RaplPackage(int(match.group(1)), RaplZone(entry, name), dram))
    if not packages:
        raise MeterError(f"rapl: {root / 'intel-rapl:0'} not present (no RAPL package zone under {root})")
    packages.sort(key=lambda p: p.number)
    return packages


class RaplMeter(Meter):
    """Energy of one CPU package (optionally plus its DRAM) from RAPL.

    Args:
        package: package number N of the ``intel-rapl:N`` zone.
        root: powercap root directory.
        include_dram: add the package's ``dram`` sub-zone when it exists (it
            does not on most client CPUs; :meth:`device_info` says whether it
            was included).
        poll_interval_s: if set, read in the background at this interval so
            that no wrap-around is missed while nobody calls ``read()``. Must be
            shorter than the wrap period (see module doc).
        read_text: file reader, injectable for tests.
        clock_ns: monotonic clock for reading timestamps.
        host_id: the host the package is in (:mod:`inference.meters.host`); ``None`` detects it.

    The ``device_id`` is ``rapl:<host id>:intel-rapl:N``: package numbers repeat on every host.

    Raises:
        MeterError: the zone is missing or its files cannot be read (the message
            names the file, and explains the root-only permission).
    """

    def __init__(
        self,
        package: int = 0,
        *,
        root: str | Path = DEFAULT_POWERCAP_ROOT,
        include_dram: bool = True,
        poll_interval_s: float | None = None,
        read_text: ReadText = _read_text,
        clock_ns: ClockNs = time.monotonic_ns,
        host_id: str | None = None,
    ) -> None:
        if poll_interval_s is not None and poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s!r}")
        self._read_text = read_text
        packages = {p.number: p for p in find_packages(root, read_text=read_text)}
        if package not in packages:
            raise MeterError(f"rapl: {Path(root) / f'intel-rapl:{package}'} not present")
        pkg = packages[package]
        self._package = pkg
        self._zones = [pkg.zone] + ([pkg.dram] if include_dram and pkg.dram is not None else [])
        # Read everything once now so an unreadable file fails at construction,
        # where start-up can log it, not on the first request.
        self._wrap_uj = [_read_int(read_text, z.max_range_file) for z in self._zones]
        for z in self._zones:
            _read_int(read_text, z.energy_file)
        self._counters = [CounterAccumulator(wrap_at=w) for w in self._wrap_uj]
        self._poll_interval_s = poll_interval_s
        self._poller: PeriodicThread | None = None
        self._host_id = detect_host_id(host_id)
        super().__init__(rapl_device_id(self._host_id, pkg.zone.path.name), clock_ns=clock_ns)

    @property
    def method(self) -> MeterMethod:
        return "rapl"

    @property
    def includes_dram(self) -> bool:
        return len(self._zones) > 1

    @property
    def wraps(self) -> int:
        """Wrap-arounds seen so far, over all zones."""
        return sum(c.wraps for c in self._counters)

    @property
    def last_poll_error(self) -> BaseException | None:
        return self._poller.last_error if self._poller is not None else None

    def device_info(self) -> dict[str, str]:
        dram = "included" if self.includes_dram else ("not included" if self._package.dram else "not present")
        return {
            "host_id": self._host_id,
            "zone": str(self._package.zone.path),
            "name": self._package.zone.name,
            "dram": dram,
            "max_energy_range_uj": ",".join(str(w) for w in self._wrap_uj),
        }

    def _raw(self) -> list[int]:
        return [_read_int(self._read_text, z.energy_file) for z in self._zones]

    def _start(self) -> None:
        self._counters = [CounterAccumulator(wrap_at=w) for w in self._wrap_uj]
        for counter, raw in zip(self._counters, self._raw(), strict=True):
            counter.feed(raw)
        if self._poll_interval_s is not None:
            self._poller = PeriodicThread(
                f"rapl-poll-{self._package.number}", self._poll_interval_s, self._poll
            )
            self._poller.start()

    def _poll(self) -> None:
        with self._lock:
            if self.started:
                self._read()

    def _read(self) -> tuple[float, int]:
        raws = self._raw()
        t_ns = self._clock_ns()
        total_uj = sum(c.feed(raw) for c, raw in zip(self._counters, raws, strict=True))
        return total_uj / 1e6, t_ns

    def _close(self, *, was_started: bool) -> None:
        if self._poller is not None:
            self._poller.stop()
