"""What the gateway says about itself and its models: server and model metadata, readiness, model
configuration, statistics, the repository index (KServe v2 / Triton JSON documents) and the Prometheus text.

Transport-neutral: each function returns the document's bytes or raises the InferenceError that answers
instead; the front end picks the status line and headers. Called on the event loop's thread; the counters
read here are written by the instance threads, and stats.py reads them under each model's own lock.
"""

from __future__ import annotations

import time

import orjson

from inference.efficiency import prometheus_lines as efficiency_prometheus_lines
from inference.errors import THREAD_ERRORS, InferenceError, NotFound, ThreadErrors
from inference.repository import ModelRepository
from inference.stats import prometheus_label, prometheus_text
from inference.variants import prometheus_lines as variant_prometheus_lines

SERVER_NAME = "carbonledger"
SERVER_VERSION = "0.1.0"
EXTENSIONS = [
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_repository",
    "model_configuration",
    "schedule_policy",
]
SERVER_METADATA = orjson.dumps({"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS})


def server_ready(repository: ModelRepository, started: bool) -> bool:
    """Ready once started and every model has a ready version (Triton's readiness)."""
    return started and all(e.ready_versions for e in repository.models.values())


def model_metadata(repository: ModelRepository, name: str, version: str | None) -> bytes:
    entry = repository.entry(name)
    if version:
        repository.version(name, version)
    elif not entry.ready_versions:
        repository.version(name, None)  # raises with the reason
    return entry.metadata_bytes


def check_model_ready(repository: ModelRepository, name: str, version: str | None) -> None:
    """Returns when the model (or that version of it) is ready; raises why it is not."""
    entry = repository.entry(name)
    if version:
        mv = entry.versions.get(version)
        if mv is None:
            raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
        ok, reason = mv.ready, mv.reason
    else:
        ok = bool(entry.ready_versions)
        reason = entry.reason
    if not ok:
        raise InferenceError(
            f"Model version not ready: {reason}" if reason else "Model version not ready", 400
        )


def model_config(repository: ModelRepository, name: str, version: str | None) -> bytes:
    entry = repository.entry(name)
    if entry.spec is None:
        raise InferenceError(f"model '{name}' has a broken config: {entry.reason}", 400)
    if version:
        repository.version(name, version)
    if entry.versions:
        return next(iter(entry.versions.values())).config_bytes
    return orjson.dumps(entry.spec.config_dict)


def statistics(repository: ModelRepository, name: str | None, version: str | None) -> bytes:
    """Triton's statistics document: every model's versions (``name`` None), one model's, or one version's."""
    if name is None:
        versions = repository.all_versions()
    elif version:
        versions = [repository.version(name, version)]
    else:
        versions = list(repository.entry(name).versions.values())
    return orjson.dumps({"model_stats": [mv.stats.as_triton() for mv in versions]})


def repository_index(repository: ModelRepository) -> bytes:
    return orjson.dumps(repository.index())


def thread_error_lines(counts: dict[str, int]) -> list[str]:
    """``carbonledger_thread_errors_total``: per background thread, the failed iterations it survived."""
    lines = [
        "# HELP carbonledger_thread_errors_total Exceptions a background thread survived (logged once, then "
        "counted), by thread name",
        "# TYPE carbonledger_thread_errors_total counter",
    ]
    for thread, count in sorted(counts.items()):
        lines.append(f'carbonledger_thread_errors_total{{thread="{prometheus_label(thread)}"}} {count}')
    return lines


def metrics_text(repository: ModelRepository, thread_errors: ThreadErrors = THREAD_ERRORS) -> bytes:
    """The Prometheus exposition: Triton's counters per version, the planners' and the variant policies', and
    the errors background threads survived."""
    versions = repository.all_versions()
    entries = [(mv.stats, mv.batcher.pending_count if mv.batcher is not None else 0) for mv in versions]
    planners = [
        (mv.spec.name, mv.version, mv.batcher.planner)
        for mv in versions
        if mv.batcher is not None and mv.batcher.planner is not None
    ]
    policies = [(mv.spec.name, mv.variant_policy) for mv in versions if mv.variant_policy is not None]
    extra = (
        efficiency_prometheus_lines(planners, time.monotonic_ns())
        + variant_prometheus_lines(repository.grid, policies)
        + thread_error_lines(thread_errors.counts())
    )
    return prometheus_text(entries, extra)
