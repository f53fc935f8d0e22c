"""Per model-version statistics in Triton's format, and Prometheus text with Triton's names.

Batch-level counters are written only by the instance threads (under one lock per model), so
the event loop pays nothing per successful request.

Latency histograms sit beside Triton's counters. Triton has no request, queue or compute histogram to copy
(its only one, ``nv_inference_first_response_histogram_ms``, is for decoupled models; its latency summaries'
quantiles cannot be added up across replicas), so they carry this project's prefix and Triton's names and unit
otherwise: ``carbonledger_inference_request_duration_us`` and so on, whose ``_sum`` is the counter's total.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")

# Upper bounds of the latency histograms' buckets, in µs: 100 µs to 10 s, about three per decade, so that a
# p99 across replicas (histogram_quantile over the summed buckets) is read to within a bucket's width.
LATENCY_BUCKETS_US: tuple[int, ...] = (
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
)


class Histogram:
    """Counts of observations per bucket (``value <= bound``, Prometheus' ``le``), their sum and number.

    Not locked: its owner (``ModelStats``) writes and reads it under its own lock.
    """

    __slots__ = ("_bounds_ns", "bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"histogram bounds must rise strictly, got {list(bounds)}")
        self.bounds = tuple(bounds)
        self._bounds_ns = tuple(b * 1000 for b in self.bounds)  # for observe_ns: no division per value
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """``n`` observations of ``value``."""
        self.counts[bisect.bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def observe_ns(self, values_ns: Sequence[int]) -> None:
        """One observation of each duration in ``values_ns``, given in ns for a histogram in µs: a batch's
        requests at once, one bucket lookup each."""
        counts, bounds, find = self.counts, self._bounds_ns, bisect.bisect_left
        for ns in values_ns:
            counts[find(bounds, ns)] += 1
        self.sum += sum(values_ns) / 1000
        self.count += len(values_ns)

    def cumulative(self) -> list[int]:
        """Observations at or below each bound, then all of them (the ``+Inf`` bucket)."""
        out = []
        total = 0
        for c in self.counts:
            total += c
            out.append(total)
        return out

    def copy(self) -> Histogram:
        twin = Histogram.__new__(Histogram)
        twin.bounds, twin._bounds_ns = self.bounds, self._bounds_ns
        twin.counts, twin.sum, twin.count = list(self.counts), self.sum, self.count
        return twin


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class _BatchSizeStats:
    compute_input: _Duration = field(default_factory=_Duration)
    compute_infer: _Duration = field(default_factory=_Duration)
    compute_output: _Duration = field(default_factory=_Duration)


class ModelStats:
    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        self._lock = threading.Lock()
        self.last_inference_ms = 0
        self.inference_count = 0  # rows
        self.execution_count = 0  # batches
        self.success = _Duration()
        self.fail = _Duration()
        self.queue = _Duration()
        self.compute_input = _Duration()
        self.compute_infer = _Duration()
        self.compute_output = _Duration()
        self.batch_stats: dict[int, _BatchSizeStats] = {}
        self.failures: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)
        # Successful requests only, like nv_inference_request_success: each histogram's count is that counter.
        self.request_hist = Histogram(LATENCY_BUCKETS_US)
        self.queue_hist = Histogram(LATENCY_BUCKETS_US)
        self.compute_infer_hist = Histogram(LATENCY_BUCKETS_US)

    def record_batch(
        self,
        rows: int,
        requests: int,
        queue_ns: int,
        request_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
        request_each_ns: Sequence[int] = (),
        queue_each_ns: Sequence[int] = (),
    ) -> None:
        """One executed batch of ``requests`` requests holding ``rows`` rows; ``request_each_ns`` and
        ``queue_each_ns``, each request's durations (summing to ``request_ns`` and ``queue_ns``), feed the
        histograms. Called once per batch on its instance thread: a bucket lookup per request is all it adds."""
        with self._lock:
            self.last_inference_ms = int(time.time() * 1000)
            self.inference_count += rows
            self.execution_count += 1
            self.success.add(request_ns, requests)
            self.queue.add(queue_ns, requests)
            # Triton attributes each batch's compute time to every request in it.
            self.compute_input.add(compute_input_ns * requests, requests)
            self.compute_infer.add(compute_infer_ns * requests, requests)
            self.compute_output.add(compute_output_ns * requests, requests)
            bs = self.batch_stats.get(rows)
            if bs is None:
                bs = self.batch_stats[rows] = _BatchSizeStats()
            bs.compute_input.add(compute_input_ns)
            bs.compute_infer.add(compute_infer_ns)
            bs.compute_output.add(compute_output_ns)
            self.request_hist.observe_ns(request_each_ns)
            self.queue_hist.observe_ns(queue_each_ns)
            self.compute_infer_hist.observe(compute_infer_ns / 1000, requests)

    def record_failure(self, reason: str, request_ns: int, count: int = 1) -> None:
        with self._lock:
            self.fail.add(request_ns, count)
            self.failures[reason if reason in self.failures else "OTHER"] += count

    def as_triton(self) -> dict[str, Any]:
        with self._lock:
            return {
                "name": self.name,
                "version": self.version,
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {
                    "success": self.success.as_dict(),
                    "fail": self.fail.as_dict(),
                    "queue": self.queue.as_dict(),
                    "compute_input": self.compute_input.as_dict(),
                    "compute_infer": self.compute_infer.as_dict(),
                    "compute_output": self.compute_output.as_dict(),
                    "cache_hit": {"count": 0, "ns": 0},
                    "cache_miss": {"count": 0, "ns": 0},
                },
                "response_stats": {},
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": b.compute_input.as_dict(),
                        "compute_infer": b.compute_infer.as_dict(),
                        "compute_output": b.compute_output.as_dict(),
                    }
                    for size, b in sorted(self.batch_stats.items())
                ],
                "memory_usage": [],
            }


_METRICS = (
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
    (
        "nv_inference_exec_count",
        "counter",
        "Number of model executions performed (does not include cached requests)",
    ),
    ("nv_inference_request_duration_us", "counter", "Cumulative inference request duration in microseconds"),
    ("nv_inference_queue_duration_us", "counter", "Cumulative inference queuing duration in microseconds"),
    (
        "nv_inference_compute_input_duration_us",
        "counter",
        "Cumulative compute input duration in microseconds",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "counter",
        "Cumulative compute inference duration in microseconds",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "counter",
        "Cumulative inference compute output duration in microseconds",
    ),
    (
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
    ),
)


def prometheus_label(value: str) -> str:
    """A label value escaped for the Prometheus text format."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_HISTOGRAMS = (
    (
        "carbonledger_inference_request_duration_us",
        "request_hist",
        "Successful inference requests by end-to-end duration in microseconds, received to batch done "
        "(Triton's nv_inference_request_duration_us, as a histogram)",
    ),
    (
        "carbonledger_inference_queue_duration_us",
        "queue_hist",
        "Successful inference requests by time waiting in the scheduling queue in microseconds "
        "(Triton's nv_inference_queue_duration_us, as a histogram)",
    ),
    (
        "carbonledger_inference_compute_infer_duration_us",
        "compute_infer_hist",
        "Successful inference requests by the model execution time of their batch in microseconds "
        "(Triton's nv_inference_compute_infer_duration_us, as a histogram)",
    ),
)


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


def histogram_lines(name: str, help_text: str, series: list[tuple[str, Histogram]]) -> list[str]:
    """One histogram family in Prometheus text: ``series`` holds (label text without braces, histogram)."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for labels, hist in series:
        sep = "," if labels else ""
        for bound, count in zip((*hist.bounds, None), hist.cumulative(), strict=True):
            le = "+Inf" if bound is None else _number(bound)
            lines.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {count}')
        lines.append(f"{name}_sum{{{labels}}} {_number(hist.sum)}")
        lines.append(f"{name}_count{{{labels}}} {hist.count}")
    return lines


def prometheus_text(entries: list[tuple[ModelStats, int]], extra: list[str] | None = None) -> bytes:
    """Render ``(stats, pending)`` pairs in Prometheus text format with Triton's metric names, and the
    latency histograms."""
    lines: list[str] = []
    snapshots = []
    histograms: dict[str, list[tuple[str, Histogram]]] = {name: [] for name, _, _ in _HISTOGRAMS}
    for stats, pending in entries:
        with stats._lock:
            label_text = f'model="{prometheus_label(stats.name)}",version="{prometheus_label(stats.version)}"'
            for name, attribute, _ in _HISTOGRAMS:
                histograms[name].append((label_text, getattr(stats, attribute).copy()))
            snapshots.append(
                (
                    label_text,
                    {
                        "nv_inference_request_success": stats.success.count,
                        "nv_inference_count": stats.inference_count,
                        "nv_inference_exec_count": stats.execution_count,
                        "nv_inference_request_duration_us": (stats.success.ns + stats.fail.ns) // 1000,
                        "nv_inference_queue_duration_us": stats.queue.ns // 1000,
                        "nv_inference_compute_input_duration_us": stats.compute_input.ns // 1000,
                        "nv_inference_compute_infer_duration_us": stats.compute_infer.ns // 1000,
                        "nv_inference_compute_output_duration_us": stats.compute_output.ns // 1000,
                        "nv_inference_pending_request_count": pending,
                    },
                    dict(stats.failures),
                )
            )
    for metric, kind, help_text in _METRICS:
        lines.append(f"# HELP {metric} {help_text}")
        lines.append(f"# TYPE {metric} {kind}")
        for labels, values, failures in snapshots:
            if metric == "nv_inference_request_failure":
                for reason in FAILURE_REASONS:
                    lines.append(f'{metric}{{{labels},reason="{reason}"}} {failures[reason]}')
            else:
                lines.append(f"{metric}{{{labels}}} {values[metric]}")
    for name, _, help_text in _HISTOGRAMS:
        lines.extend(histogram_lines(name, help_text, histograms[name]))
    if extra:
        lines.extend(extra)
    return ("\n".join(lines) + "\n").encode()
