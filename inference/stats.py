"""Per model-version statistics in Triton's format, and Prometheus text with Triton's names.

Batch-level counters are written only by the instance threads (under one lock per model), so
the event loop pays nothing per successful request.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")


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

    def record_batch(
        self,
        rows: int,
        requests: int,
        queue_ns: int,
        request_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """One executed batch of ``requests`` requests holding ``rows`` rows."""
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


def prometheus_text(entries: list[tuple[ModelStats, int]], extra: list[str] | None = None) -> bytes:
    """Render ``(stats, pending)`` pairs in Prometheus text format with Triton's metric names."""
    lines: list[str] = []
    snapshots = []
    for stats, pending in entries:
        with stats._lock:
            snapshots.append(
                (
                    f'model="{prometheus_label(stats.name)}",version="{prometheus_label(stats.version)}"',
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
    if extra:
        lines.extend(extra)
    return ("\n".join(lines) + "\n").encode()
