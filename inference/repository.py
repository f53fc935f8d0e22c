"""Model repository in Triton's layout: ``<root>/<model>/config.pbtxt`` and ``<root>/<model>/<version>/``.

A model whose config or files are broken is kept as *not ready* with the reason; the others
still load. Each ready version owns one DynamicBatcher and one backend per instance.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

from inference.backends import Backend, create_backend
from inference.batcher import (
    BatchHook,
    BatchPolicy,
    BatchTiming,
    DeliverFn,
    DynamicBatcher,
    Pending,
    QueuePolicy,
)
from inference.config import ConfigError, ModelSpec, config_json_bytes, load_config, parameter_number
from inference.efficiency import EfficiencySettings
from inference.errors import BackendError, InferenceError, ModelNotReady, NotFound
from inference.limits import MODEL_NAME_MAX_LENGTH, MODEL_VERSION_MAX_LENGTH
from inference.stats import ModelStats
from inference.variants import (
    MAX_LABEL,
    GridState,
    Variant,
    VariantPolicy,
    accuracy_floor,
    check_variant_parameters,
    compatible,
    declared_accuracy,
    high_load_rows,
    variant_label,
)

log = logging.getLogger(__name__)
_VERSION_DIR = re.compile(r"[0-9]+")


@dataclass
class GatewayOptions:
    """Everything the gateway core takes from settings, passed in (never read at import)."""

    triton_url: str = ""
    triton_protocol: str = "http"
    remote_timeout_s: float = 5.0
    onnx_threads: int = 1
    adaptive_delay: bool = True
    max_body_bytes: int = 64 * 1024 * 1024
    # Carbon-aware mode: while the grid state is above its threshold, the batcher's planner uses at least
    # this knob (models with a latency objective) and the variant policies pick their cheaper variants.
    carbon_aware: bool = True
    carbon_aware_efficiency: float = 1.0
    # Once the models are loaded, move every object then alive out of the garbage collector's reach
    # (gc.freeze): a full collection otherwise re-scans Django, numpy and the model runtimes and held the
    # event loop for 44 ms (measured with gc.callbacks under bench/efficiency.py's load).
    freeze_heap_after_start: bool = False


class HasInputs(Protocol):
    inputs: dict[str, np.ndarray[Any, Any]]
    received_ns: int


def efficiency_settings(spec: ModelSpec) -> EfficiencySettings:
    """``energy_efficiency`` (0..1) and ``latency_slo_ms`` from the model's ``parameters``."""

    knob = parameter_number(spec, "energy_efficiency")
    slo_ms = parameter_number(spec, "latency_slo_ms")
    if knob is None and slo_ms is None:
        return EfficiencySettings()
    if slo_ms is not None and slo_ms <= 0:
        raise ConfigError(f"model '{spec.name}': parameter 'latency_slo_ms' must be above 0, got {slo_ms}")
    if knob and spec.dynamic_batching is None:
        raise ConfigError(f"model '{spec.name}': energy_efficiency needs dynamic_batching in config.pbtxt")
    try:
        return EfficiencySettings(
            energy_efficiency=knob or 0.0, latency_slo_ns=int((slo_ms or 0) * 1_000_000)
        )
    except ValueError as exc:
        raise ConfigError(f"model '{spec.name}': {exc}") from None


def batch_policy(spec: ModelSpec, adaptive_default: bool) -> BatchPolicy:
    db = spec.dynamic_batching
    adaptive = spec.param_bool("adaptive_delay", adaptive_default)
    efficiency = efficiency_settings(spec)
    if db is None:
        return BatchPolicy(max_batch_size=spec.max_batch_size, dynamic=False, adaptive_delay=False)

    def qp(p: Any) -> QueuePolicy:
        return QueuePolicy(
            max_queue_size=p.max_queue_size,
            default_timeout_ns=p.default_timeout_us * 1000,
            timeout_action=p.timeout_action,
            allow_timeout_override=p.allow_timeout_override,
        )

    return BatchPolicy(
        max_batch_size=spec.max_batch_size,
        dynamic=True,
        preferred_batch_sizes=db.preferred_batch_size,
        max_queue_delay_ns=db.max_queue_delay_us * 1000,
        preserve_ordering=db.preserve_ordering,
        priority_levels=db.priority_levels,
        default_priority_level=db.default_priority_level,
        default_queue_policy=qp(db.default_queue_policy),
        queue_policies={k: qp(v) for k, v in db.priority_queue_policy.items()},
        adaptive_delay=adaptive,
        efficiency=efficiency,
    )


def metadata_platform(spec: ModelSpec) -> str:
    return spec.platform or spec.backend


class ModelVersion:
    """One loaded (or failed) version of a model."""

    def __init__(self, spec: ModelSpec, version: str, path: Path) -> None:
        self.spec = spec
        self.version = version
        self.path = path
        self.stats = ModelStats(spec.name, version)
        self.ready = False
        self.reason = ""
        self.batcher: DynamicBatcher | None = None
        self.backends: list[Backend] = []
        self.config_bytes = config_json_bytes(spec)
        self.output_specs = {t.name: t for t in spec.outputs}
        self.variant = variant_label(spec)
        self.variant_policy: VariantPolicy | None = None
        # Variant model -> its backends, one per instance of this model: each instance thread runs its own,
        # never another model's (backends are used by one thread only).
        self.variant_backends: dict[str, list[Backend]] = {}

    def runner(
        self, backend: Backend, index: int = 0
    ) -> Callable[[list[Pending]], tuple[Sequence[Any], tuple[int, int, int]]]:
        import time

        spec = self.spec
        names = [t.name for t in spec.inputs]
        out_names = [t.name for t in spec.outputs]
        batched = spec.max_batch_size > 0
        clock = time.perf_counter_ns
        model_label = f"model '{spec.name}' version {self.version}"

        def run(batch: list[Pending]) -> tuple[Sequence[Any], tuple[int, int, int]]:
            t0 = clock()
            execute, label = backend.execute, self.variant
            policy = self.variant_policy
            if policy is not None:
                choice = policy.choose(self.batcher.queued_rows if self.batcher is not None else 0)
                stand_ins = self.variant_backends.get(choice.variant.model)
                if stand_ins is not None and index < len(stand_ins):
                    execute, label = stand_ins[index].execute, choice.variant.label
            for p in batch:
                p.variant = label
            if len(batch) == 1:
                inputs = batch[0].payload.inputs
            else:
                inputs = {}
                for n in names:
                    parts = [p.payload.inputs[n] for p in batch if n in p.payload.inputs]
                    if parts:
                        inputs[n] = np.concatenate(parts)
            t1 = clock()
            try:
                outputs = execute(inputs)
            except InferenceError:
                raise
            except Exception as exc:
                raise BackendError(f"{model_label} failed: {type(exc).__name__}: {exc}") from exc
            t2 = clock()
            for n in out_names:
                if n not in outputs:
                    raise BackendError(f"{model_label} returned no output '{n}'")
            if len(batch) == 1 or not batched:
                results: list[Any] = [outputs]
            else:
                total = sum(p.rows for p in batch)
                for n in out_names:
                    if outputs[n].shape[:1] != (total,):
                        raise BackendError(
                            f"{model_label} returned output '{n}' with {outputs[n].shape[0] if outputs[n].ndim else 0} "
                            f"rows for a batch of {total}"
                        )
                results = []
                start = 0
                for p in batch:
                    end = start + p.rows
                    results.append({n: outputs[n][start:end] for n in out_names})
                    start = end
            t3 = clock()
            return results, (t1 - t0, t2 - t1, t3 - t2)

        return run

    def stats_hook(self) -> BatchHook:
        return _StatsHook(self.stats)


class _StatsHook:
    """Triton's statistics, recorded once per batch on the instance thread."""

    def __init__(self, stats: ModelStats) -> None:
        self.stats = stats

    def begin(self, index: int, batch: list[Pending]) -> None:
        pass

    def end(self, index: int, batch: list[Pending], timing: BatchTiming, error: BaseException | None) -> None:
        if error is not None:
            reason = error.reason if isinstance(error, InferenceError) else "BACKEND"
            self.stats.record_failure(
                reason, sum(timing.end_ns - p.payload.received_ns for p in batch), len(batch)
            )
            return
        queue_each = [timing.start_ns - p.enqueued_ns for p in batch]
        request_each = [timing.end_ns - p.payload.received_ns for p in batch]
        self.stats.record_batch(
            rows=sum(p.rows for p in batch),
            requests=len(batch),
            queue_ns=sum(queue_each),
            request_ns=sum(request_each),
            compute_input_ns=timing.compute_input_ns,
            compute_infer_ns=timing.compute_infer_ns,
            compute_output_ns=timing.compute_output_ns,
            request_each_ns=request_each,
            queue_each_ns=queue_each,
        )


class ModelEntry:
    def __init__(self, name: str, spec: ModelSpec | None, reason: str = "") -> None:
        self.name = name
        self.spec = spec
        self.reason = reason
        self.versions: dict[str, ModelVersion] = {}
        self.metadata_bytes = b""
        self._ready: list[ModelVersion] | None = None

    @property
    def ready_versions(self) -> list[ModelVersion]:
        # Computed once after loading (build_metadata); readiness does not change while serving.
        if self._ready is None:
            self._ready = sorted((v for v in self.versions.values() if v.ready), key=lambda v: int(v.version))
        return self._ready

    def build_metadata(self) -> None:
        spec = self.spec
        if spec is None:
            return
        lead = [-1] if spec.max_batch_size > 0 else []
        doc = {
            "name": spec.name,
            "versions": [v.version for v in self.ready_versions],
            "platform": metadata_platform(spec),
            "inputs": [
                {"name": t.name, "datatype": t.datatype, "shape": [*lead, *t.dims]} for t in spec.inputs
            ],
            "outputs": [
                {"name": t.name, "datatype": t.datatype, "shape": [*lead, *t.dims]} for t in spec.outputs
            ],
        }
        self.metadata_bytes = orjson.dumps(doc)


def select_versions(spec: ModelSpec, available: list[int]) -> list[int]:
    policy = spec.version_policy
    ordered = sorted(available)
    if "all" in policy:
        return ordered
    if "specific" in policy:
        wanted = {int(v) for v in policy["specific"].get("versions", [])}
        return [v for v in ordered if v in wanted]
    n = int(policy.get("latest", {}).get("num_versions", 1) or 1)
    return ordered[-n:]


class ModelRepository:
    def __init__(
        self,
        root: Path,
        options: GatewayOptions,
        deliver: DeliverFn,
        hooks: Sequence[Callable[[ModelVersion], BatchHook]] = (),
    ) -> None:
        self.root = root
        self.options = options
        self._deliver = deliver
        self._hook_factories = list(hooks)
        self.models: dict[str, ModelEntry] = {}
        self.grid = GridState()

    def load(self) -> None:
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository {self.root} does not exist")
        for model_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")):
            self.models[model_dir.name] = self._load_model(model_dir)
        self._link_variants()
        for entry in self.models.values():
            state = "READY" if entry.ready_versions else f"UNAVAILABLE ({entry.reason or 'no ready version'})"
            log.info("model %s: %s", entry.name, state)

    def _load_model(self, model_dir: Path) -> ModelEntry:
        if len(model_dir.name) > MODEL_NAME_MAX_LENGTH:
            # The ledger stores the name with every request: a wider one would be refused at every drain.
            return ModelEntry(
                model_dir.name,
                None,
                f"the model name must be at most {MODEL_NAME_MAX_LENGTH} characters (the ledger's column), "
                f"got {len(model_dir.name)}",
            )
        try:
            spec = load_config(model_dir)
            batch_policy(spec, self.options.adaptive_delay)  # validates model-level parameters
            check_variant_parameters(spec)
        except (ConfigError, ValueError) as exc:
            return ModelEntry(model_dir.name, None, str(exc))
        except Exception as exc:  # a config the schema accepts but we trip on must not stop the others
            log.exception("model %s: unexpected error reading its config", model_dir.name)
            return ModelEntry(model_dir.name, None, f"{type(exc).__name__}: {exc}")
        entry = ModelEntry(spec.name, spec)
        # A version number wider than the ledger's column is not a version we can record: skipped, as any
        # other directory that is not a version.
        available = [
            int(p.name)
            for p in model_dir.iterdir()
            if p.is_dir()
            and _VERSION_DIR.fullmatch(p.name)
            and len(str(int(p.name))) <= MODEL_VERSION_MAX_LENGTH
        ]
        chosen = select_versions(spec, available)
        if not chosen:
            entry.reason = (
                f"{model_dir}: no version directory matches the version policy {spec.version_policy}"
            )
        for v in chosen:
            mv = ModelVersion(spec, str(v), model_dir / str(v))
            entry.versions[mv.version] = mv
            self._load_version(mv)
        if not entry.ready_versions and not entry.reason:
            entry.reason = "; ".join(f"version {v.version}: {v.reason}" for v in entry.versions.values())
        entry.build_metadata()
        return entry

    def _link_variants(self) -> None:
        """Give each base model that sets ``accuracy_floor`` its policy over the variants standing in for it."""
        for entry in self.models.values():
            try:
                self._link_variants_of(entry)
            except Exception:  # one model's variants must not stop the others from serving
                log.exception("model %s: variants not linked; it serves as itself", entry.name)

    def _variant_backends(self, base: ModelVersion, variant: ModelVersion) -> list[Backend]:
        """One backend of ``variant`` per instance of ``base``, built for it and closed with it."""
        made: list[Backend] = []
        try:
            for i in range(len(base.backends)):
                made.append(create_backend(variant.spec, variant.version, variant.path, i, self.options))
        except Exception:
            for b in made:
                with contextlib.suppress(Exception):
                    b.close()
            raise
        return made

    def _link_variants_of(self, entry: ModelEntry) -> None:
        spec = entry.spec
        if spec is None or not entry.ready_versions:
            return
        floor = accuracy_floor(spec)
        if floor is None:
            return
        base_accuracy = declared_accuracy(spec)
        if base_accuracy is None:
            log.warning(
                "model %s: accuracy_floor is set but its own 'accuracy' is not; no variants", spec.name
            )
            return
        eligible: list[tuple[Variant, ModelVersion]] = []
        for other in self.models.values():
            ospec = other.spec
            if ospec is None or other is entry or ospec.parameters.get("variant_of", "").strip() != spec.name:
                continue
            accuracy = declared_accuracy(ospec)
            why = "it is not ready" if not other.ready_versions else compatible(spec, ospec)
            if not why and accuracy is None:
                why = "it declares no accuracy"
            if not why and accuracy is not None and accuracy < floor * base_accuracy:
                why = f"its accuracy {accuracy:.4f} is below the floor {floor} x {base_accuracy:.4f}"
            if why or accuracy is None:
                log.info("model %s: variant %s not used: %s", spec.name, ospec.name, why)
                continue
            variant = Variant(ospec.name, variant_label(ospec) or ospec.name[:MAX_LABEL], accuracy)
            eligible.append((variant, other.ready_versions[-1]))
        order = [m.strip() for m in spec.parameters.get("variants", "").split(",") if m.strip()]
        eligible.sort(
            key=lambda vm: (order.index(vm[0].model) if vm[0].model in order else len(order), vm[0].accuracy)
        )
        base = Variant(spec.name, variant_label(spec) or spec.name[:MAX_LABEL], base_accuracy)
        for mv in entry.ready_versions:
            usable: list[Variant] = []
            for variant, vmv in eligible:
                try:
                    mv.variant_backends[variant.model] = self._variant_backends(mv, vmv)
                except Exception as exc:
                    log.warning("model %s: variant %s not loaded for it: %s", spec.name, vmv.spec.name, exc)
                    continue
                usable.append(variant)
            mv.variant = base.label
            mv.variant_policy = VariantPolicy(
                base, usable, high_load_rows(spec), self.grid, carbon_aware=self.options.carbon_aware
            )
            log.info(
                "model %s version %s: variants %s within the accuracy floor %s",
                spec.name,
                mv.version,
                ", ".join(v.label for v in usable) or "none",
                floor,
            )

    def _load_version(self, mv: ModelVersion) -> None:
        spec = mv.spec
        created: list[Backend] = []
        try:
            for i in range(spec.instance_count):
                created.append(create_backend(spec, mv.version, mv.path, i, self.options))
        except Exception as exc:  # a broken model must not stop the others
            mv.reason = f"failed to load: {type(exc).__name__}: {exc}"
            log.warning("model %s version %s %s", spec.name, mv.version, mv.reason)
            for b in created:  # instances built before the failing one still hold resources
                with contextlib.suppress(Exception):
                    b.close()
            return
        mv.backends = created
        # Statistics last: a hook that refuses a batch (the ledger, when its spool is full) turns
        # it into failures before it is counted.
        hooks = [*(f(mv) for f in self._hook_factories), mv.stats_hook()]
        backends = mv.backends
        mv.batcher = DynamicBatcher(
            f"{spec.name}/{mv.version}",
            batch_policy(spec, self.options.adaptive_delay),
            lambda i: mv.runner(backends[i], i),
            self._deliver,
            instances=len(backends),
            hooks=hooks,
            grid=self.grid if self.options.carbon_aware else None,
            carbon_aware_efficiency=self.options.carbon_aware_efficiency,
        )
        mv.batcher.start()
        mv.ready = True

    def stop(self) -> None:
        # Every batcher first: a base model's instances run batches on backends of its variants.
        for entry in self.models.values():
            for mv in entry.versions.values():
                if mv.batcher is not None:
                    mv.batcher.stop()
        for entry in self.models.values():
            for mv in entry.versions.values():
                for b in [*mv.backends, *(b for bs in mv.variant_backends.values() for b in bs)]:
                    try:
                        b.close()
                    except Exception:
                        log.exception("closing backend of %s/%s", entry.name, mv.version)

    def entry(self, name: str) -> ModelEntry:
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return entry

    def version(self, name: str, version: str | None) -> ModelVersion:
        """The version to serve; the highest ready one when ``version`` is empty."""
        entry = self.entry(name)
        if version:
            mv = entry.versions.get(version)
            if mv is None:
                raise NotFound(f"Request for unknown model: '{name}' version {version} is not found")
            if not mv.ready:
                raise ModelNotReady(f"Model '{name}' version {version} is not ready: {mv.reason}")
            return mv
        ready = entry.ready_versions
        if not ready:
            raise NotFound(
                f"Request for unknown model: '{name}' has no available versions"
                + (f" ({entry.reason})" if entry.reason else "")
            )
        return ready[-1]

    def index(self) -> list[dict[str, str]]:
        rows: list[dict[str, str]] = []
        for entry in self.models.values():
            if not entry.versions:
                rows.append({"name": entry.name, "state": "UNAVAILABLE", "reason": entry.reason})
            for mv in sorted(entry.versions.values(), key=lambda v: int(v.version)):
                row = {
                    "name": entry.name,
                    "version": mv.version,
                    "state": "READY" if mv.ready else "UNAVAILABLE",
                }
                if not mv.ready:
                    row["reason"] = mv.reason
                rows.append(row)
        return rows

    def all_versions(self) -> list[ModelVersion]:
        return [mv for e in self.models.values() for mv in e.versions.values()]
