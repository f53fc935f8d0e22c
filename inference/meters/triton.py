"""GPU energy reported by a (possibly remote) Triton Inference Server.

Triton exports ``nv_energy_consumption{gpu_uuid="GPU-..."}`` -- joules since
the server started, per GPU -- on its Prometheus metrics endpoint (port 8002,
path ``/metrics`` by default). The value comes from NVML but is refreshed only
every metrics interval (``--metrics-interval-ms``, 2000 ms by default), so
short intervals read 0 J and then a step; attribute over many requests.
A Triton running without GPUs (or with ``--allow-gpu-metrics=false``) exports
no energy metric at all.

The counter restarts from 0 when the server restarts; like the NVML counter,
a value going down is taken as "energy since the reset" (see
:class:`~inference.meters.base.CounterAccumulator`).
"""

from __future__ import annotations

import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .base import ClockNs, CounterAccumulator, Meter, MeterError, MeterMethod

ENERGY_METRIC = "nv_energy_consumption"
DEFAULT_TIMEOUT_S = 2.0

Fetch = Callable[[str, float], str]

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class PrometheusParseError(ValueError):
    def __init__(self, line_no: int, line: str, why: str) -> None:
        super().__init__(f"line {line_no}: {why}: {line!r}")


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line of the Prometheus text exposition format."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    value: float = 0.0
    timestamp_ms: int | None = None


def _parse_labels(line: str, pos: int, line_no: int) -> tuple[dict[str, str], int]:
    """Parse ``{a="x",b="y"}`` starting at ``line[pos] == "{"``; return labels and the index after ``}``."""
    labels: dict[str, str] = {}
    pos += 1
    n = len(line)
    while True:
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == "}":
            return labels, pos + 1
        m = _LABEL_NAME.match(line, pos)
        if m is None:
            raise PrometheusParseError(line_no, line, f"expected a label name at column {pos + 1}")
        name = m.group()
        pos = m.end()
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos >= n or line[pos] != "=":
            raise PrometheusParseError(line_no, line, f"expected = after label {name}")
        pos += 1
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos >= n or line[pos] != '"':
            raise PrometheusParseError(line_no, line, f'expected " to open the value of label {name}')
        pos += 1
        chars: list[str] = []
        while True:
            if pos >= n:
                raise PrometheusParseError(line_no, line, f"unterminated value of label {name}")
            c = line[pos]
            if c == '"':
                pos += 1
                break
            if c == "\\" and pos + 1 < n:
                # Unknown escapes are kept verbatim, as Prometheus itself does.
                nxt = line[pos + 1]
                chars.append(_ESCAPES.get(nxt, "\\" + nxt))
                pos += 2
                continue
            chars.append(c)
            pos += 1
        if name in labels:
            raise PrometheusParseError(line_no, line, f"duplicate label {name}")
        labels[name] = "".join(chars)
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos < n and line[pos] == ",":
            pos += 1
        elif pos < n and line[pos] == "}":
            return labels, pos + 1
        else:
            raise PrometheusParseError(line_no, line, "expected , or } after a label value")


def _parse_value(text: str, line_no: int, line: str) -> float:
    special = {"nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}
    if text.lower() in special:
        return special[text.lower()]
    try:
        return float(text)
    except ValueError:
        raise PrometheusParseError(line_no, line, f"bad sample value {text!r}") from None


def parse_prometheus_text(text: str) -> list[Sample]:
    """Parse the Prometheus text exposition format (version 0.0.4).

    Handles ``# HELP``/``# TYPE``/other comment lines, blank lines, labels with
    ``\\\\``, ``\\"`` and ``\\n`` escapes, ``NaN``/``+Inf``/``-Inf`` and optional
    timestamps. Raises :class:`PrometheusParseError` on a malformed sample line.
    """
    samples: list[Sample] = []
    for line_no, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        m = _METRIC_NAME.match(line)
        if m is None:
            raise PrometheusParseError(line_no, raw_line, "expected a metric name")
        name, pos = m.group(), m.end()
        labels: dict[str, str] = {}
        if pos < len(line) and line[pos] == "{":
            labels, pos = _parse_labels(line, pos, line_no)
        rest = line[pos:].split()
        if not rest or len(rest) > 2 or (pos < len(line) and line[pos] not in " \t"):
            raise PrometheusParseError(line_no, raw_line, "expected a value and an optional timestamp")
        value = _parse_value(rest[0], line_no, raw_line)
        timestamp_ms: int | None = None
        if len(rest) == 2:
            try:
                timestamp_ms = int(rest[1])
            except ValueError:
                raise PrometheusParseError(line_no, raw_line, f"bad timestamp {rest[1]!r}") from None
        samples.append(Sample(name, labels, value, timestamp_ms))
    return samples


def energy_by_gpu(samples: Iterable[Sample], metric: str = ENERGY_METRIC) -> dict[str, float]:
    """Map ``gpu_uuid`` label -> joules for ``metric`` samples."""
    return {s.labels["gpu_uuid"]: s.value for s in samples if s.name == metric and "gpu_uuid" in s.labels}


def fetch_metrics_text(url: str, timeout_s: float) -> str:
    """GET ``url`` and return the body; errors become :class:`MeterError` naming the URL."""
    # urlopen would also open file:// and ftp:// URLs; a metrics URL is http(s).
    if not url.lower().startswith(("http://", "https://")):
        raise MeterError(f"triton: metrics URL must be http(s)://, got {url!r}")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body: bytes = response.read()
            charset = response.headers.get_content_charset() or "utf-8"
    except urllib.error.HTTPError as exc:
        raise MeterError(f"triton: {url} answered HTTP {exc.code} {exc.reason}") from exc
    except urllib.error.URLError as exc:
        raise MeterError(f"triton: metrics endpoint {url} unreachable: {exc.reason}") from exc
    except TimeoutError as exc:
        raise MeterError(f"triton: metrics endpoint {url} did not answer within {timeout_s} s") from exc
    except (OSError, ValueError) as exc:
        # ValueError: malformed URL; OSError: connection reset mid-body etc.
        raise MeterError(f"triton: cannot read metrics from {url}: {exc}") from exc
    return body.decode(charset, errors="replace")


def _fetch_energy(url: str, timeout_s: float, fetch: Fetch, metric: str) -> dict[str, float]:
    text = fetch(url, timeout_s)
    try:
        samples = parse_prometheus_text(text)
    except PrometheusParseError as exc:
        raise MeterError(f"triton: {url} returned malformed metrics: {exc}") from exc
    energy = energy_by_gpu(samples, metric)
    if not energy:
        raise MeterError(
            f"triton: {url} exports no {metric} metric (Triton reports GPU energy only when it runs "
            "on GPUs with GPU metrics enabled; a CPU-only server has none)"
        )
    return energy


def discover_gpus(
    url: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    fetch: Fetch = fetch_metrics_text,
    metric: str = ENERGY_METRIC,
) -> list[str]:
    """GPU UUIDs for which ``url`` exports ``metric``, sorted."""
    return sorted(_fetch_energy(url, timeout_s, fetch, metric))


class TritonMeter(Meter):
    """Energy of one GPU as reported by a Triton server's metrics endpoint.

    Args:
        url: full metrics URL, e.g. ``http://triton:8002/metrics``.
        gpu_uuid: the ``gpu_uuid`` label value; also the meter's ``device_id``,
            so it matches an :class:`~inference.meters.nvml.NvmlMeter` for the
            same GPU.
        timeout_s: per-request HTTP timeout; a ``read()`` never blocks much
            longer than this.
        metric: metric name (override only for testing or renamed metrics).
        fetch: ``(url, timeout_s) -> body text``, injectable for tests.
        clock_ns: monotonic clock for reading timestamps.

    Each ``read()`` is an HTTP request (milliseconds); construction does one
    to check that the metric for this GPU exists.
    """

    def __init__(
        self,
        url: str,
        gpu_uuid: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        metric: str = ENERGY_METRIC,
        fetch: Fetch = fetch_metrics_text,
        clock_ns: ClockNs = time.monotonic_ns,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self._url = url
        self._uuid = gpu_uuid
        self._timeout_s = timeout_s
        self._metric = metric
        self._fetch = fetch
        self._counter = CounterAccumulator()
        super().__init__(gpu_uuid, clock_ns=clock_ns)
        self._raw_j()

    @property
    def method(self) -> MeterMethod:
        return "triton"

    @property
    def url(self) -> str:
        return self._url

    def device_info(self) -> dict[str, str]:
        return {"uuid": self._uuid, "metrics_url": self._url, "metric": self._metric}

    def _raw_j(self) -> float:
        energy = _fetch_energy(self._url, self._timeout_s, self._fetch, self._metric)
        try:
            value = energy[self._uuid]
        except KeyError:
            raise MeterError(
                f"triton: {self._url} has no {self._metric} for gpu_uuid={self._uuid!r} "
                f"(it has: {', '.join(sorted(energy))})"
            ) from None
        if not math.isfinite(value) or value < 0:
            raise MeterError(f"triton: {self._url} reports {self._metric}={value!r} for {self._uuid}")
        return value

    def _start(self) -> None:
        self._counter = CounterAccumulator()
        self._counter.feed(self._raw_j())

    def _read(self) -> tuple[float, int]:
        # Note: the lock is held during the HTTP request, so concurrent readers
        # queue behind it (bounded by timeout_s); taking the value and feeding
        # it must stay together or out-of-order values would look like resets.
        total = self._counter.feed(self._raw_j())
        return total, self._clock_ns()
