"""Model variants (for example FP32 and INT8 of one network) and the policy that picks one per batch, free of
Django and of any web framework; and the grid state the carbon-aware policies read.

A variant is a model of its own in the repository (``digits_int8``) whose ``config.pbtxt`` names the model it
stands in for (``variant_of: digits``), its label (``variant: int8``) and its accuracy measured on a held-out
set (``accuracy``). The base model opts in with ``accuracy_floor``: the lowest share of its own accuracy a
variant may have to serve its requests (0.995: at least 99.5 % of the FP32 accuracy). Only variants with the
same inputs and outputs and an accuracy at or above the floor are eligible; the policy then picks, per batch:

* the base model while the load is moderate and the grid is not in its high-intensity state;
* the first eligible variant (in the order of ``variants``, else the lowest accuracy first: the smallest
  model) when the queue behind the batch holds ``variant_high_load_rows`` rows or more (the base would fall
  behind), or when the grid state says the intensity is above the site's threshold (carbon-aware mode).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from inference.config import ConfigError, ModelSpec, parameter_number
from inference.stats import prometheus_label


class GridState:
    """The grid intensity where the gateway's devices draw power, and the threshold above which serving leans
    to efficiency. Set from outside (the Django side reads the hourly series and the site's threshold); read
    by the batcher's planner and the variant policy. Unknown until set: then nothing changes."""

    def snapshot(self) -> tuple[bool, float | None, float | None]:
        """(high, intensity, threshold), consistent with one another."""
        with self._lock:
            return self.high, self.intensity_g_per_kwh, self.threshold_g_per_kwh

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.intensity_g_per_kwh: float | None = None
        self.threshold_g_per_kwh: float | None = None
        self.source = ""
        self.high = False

    def update(
        self, intensity_g_per_kwh: float | None, threshold_g_per_kwh: float | None, source: str
    ) -> None:
        with self._lock:
            self.intensity_g_per_kwh = intensity_g_per_kwh
            self.threshold_g_per_kwh = threshold_g_per_kwh
            self.source = source
            self.high = (
                intensity_g_per_kwh is not None
                and threshold_g_per_kwh is not None
                and intensity_g_per_kwh > threshold_g_per_kwh
            )

    @property
    def mode(self) -> str:
        if self.intensity_g_per_kwh is None or self.threshold_g_per_kwh is None:
            return "unknown"
        return "efficiency" if self.high else "normal"


@dataclass(frozen=True, slots=True)
class Variant:
    model: str  # the repository model that serves it
    label: str  # as recorded in responses and the ledger: fp32, int8...
    accuracy: float


def variant_label(spec: ModelSpec) -> str:
    return spec.parameters.get("variant", "").strip()


MAX_LABEL = 64  # the ledger's variant column


def check_variant_parameters(spec: ModelSpec) -> None:
    """Refuse, naming the model, variant parameters that would fail later (raises ValueError)."""
    label = variant_label(spec)
    if len(label) > MAX_LABEL:
        raise ValueError(f"model '{spec.name}': parameter 'variant' is longer than {MAX_LABEL} characters")
    accuracy_floor(spec)
    high_load_rows(spec)


def high_load_rows(spec: ModelSpec) -> int:
    """``variant_high_load_rows``: queued rows from which the cheaper variant serves (default max_batch_size)."""
    raw = spec.parameters.get("variant_high_load_rows", "").strip()
    if not raw:
        return max(1, spec.max_batch_size)
    if not raw.isascii() or not raw.isdigit() or int(raw) < 1:
        raise ValueError(
            f"model '{spec.name}': parameter 'variant_high_load_rows' must be a whole number >= 1, got {raw!r}"
        )
    return int(raw)


def instance_kinds(spec: ModelSpec) -> tuple[str, ...]:
    groups = spec.config_dict.get("instance_group") or [{}]
    return tuple(sorted(str(g.get("kind", "KIND_AUTO")) for g in groups))


def accuracy_floor(spec: ModelSpec) -> float | None:
    """The base model's ``accuracy_floor`` (a share of its own accuracy, in (0, 1]); None: no variants."""
    value = parameter_number(spec, "accuracy_floor")
    if value is not None and not 0.0 < value <= 1.0:
        raise ConfigError(
            f"model '{spec.name}': parameter 'accuracy_floor' must be in (0, 1] (a share of its accuracy), "
            f"got {spec.parameters['accuracy_floor']!r}"
        )
    return value


def declared_accuracy(spec: ModelSpec) -> float | None:
    raw = spec.parameters.get("accuracy")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if 0.0 <= value <= 1.0 else None


def compatible(base: ModelSpec, other: ModelSpec) -> str:
    """Why ``other`` cannot stand in for ``base`` ('' when it can)."""

    def shape(spec: ModelSpec) -> tuple[object, ...]:
        return (
            tuple((t.name, t.datatype, tuple(t.dims)) for t in spec.inputs),
            tuple((t.name, t.datatype, tuple(t.dims)) for t in spec.outputs),
        )

    if shape(base) != shape(other):
        return "its inputs or outputs differ"
    if instance_kinds(base) != instance_kinds(other):
        # Its batches would be metered as the base model's device's.
        return f"it runs on {instance_kinds(other)}, not on {instance_kinds(base)} like the base model"
    if other.max_batch_size < base.max_batch_size:
        return f"its max_batch_size {other.max_batch_size} is below {base.max_batch_size}"
    return ""


@dataclass(frozen=True, slots=True)
class Choice:
    variant: Variant
    why: str


class VariantPolicy:
    """Which variant serves a batch of the base model."""

    def __init__(
        self,
        base: Variant,
        eligible: list[Variant],
        high_load_rows: int,
        grid: GridState | None = None,
        carbon_aware: bool = True,
    ) -> None:
        self.base = base
        self.eligible = eligible
        self.high_load_rows = max(1, high_load_rows)
        self.grid = grid
        self.carbon_aware = carbon_aware
        self.served: dict[str, int] = {}  # label -> batches, for /metrics
        self._lock = threading.Lock()

    def choose(self, queued_rows: int) -> Choice:
        choice = self._choose(queued_rows)
        with self._lock:
            self.served[choice.variant.label] = self.served.get(choice.variant.label, 0) + 1
        return choice

    def _choose(self, queued_rows: int) -> Choice:
        if not self.eligible:
            return Choice(self.base, "no variant within the accuracy floor")
        if queued_rows >= self.high_load_rows:
            return Choice(self.eligible[0], f"high load: {queued_rows} rows queued")
        grid = self.grid
        if self.carbon_aware and grid is not None:
            high, intensity, threshold = grid.snapshot()
            if high:
                return Choice(self.eligible[0], f"carbon-aware: {intensity} g/kWh above {threshold}")
        return Choice(self.base, "moderate load, grid not above its threshold")


def prometheus_lines(grid: GridState, policies: list[tuple[str, VariantPolicy]]) -> list[str]:
    """The grid state (carbon-aware mode) and the batches each variant served, in Prometheus text format."""
    mode = {"unknown": -1, "normal": 0, "efficiency": 1}[grid.mode]
    lines = [
        "# HELP carbonledger_carbon_aware_mode 1 while the grid is above the site's threshold (serving leans to "
        "efficiency), 0 below it, -1 while unknown",
        "# TYPE carbonledger_carbon_aware_mode gauge",
        f"carbonledger_carbon_aware_mode {mode}",
        "# HELP carbonledger_grid_intensity_g_per_kwh the grid intensity of the gateway's site now",
        "# TYPE carbonledger_grid_intensity_g_per_kwh gauge",
        f"carbonledger_grid_intensity_g_per_kwh {grid.intensity_g_per_kwh if grid.intensity_g_per_kwh is not None else 'NaN'}",
        "# HELP carbonledger_grid_threshold_g_per_kwh the intensity above which serving leans to efficiency",
        "# TYPE carbonledger_grid_threshold_g_per_kwh gauge",
        f"carbonledger_grid_threshold_g_per_kwh {grid.threshold_g_per_kwh if grid.threshold_g_per_kwh is not None else 'NaN'}",
    ]
    if policies:
        lines.append(
            "# HELP carbonledger_variant_batches_total batches of a model served by each of its variants"
        )
        lines.append("# TYPE carbonledger_variant_batches_total counter")
        for model, policy in policies:
            for label, count in sorted(policy.served.items()):
                labels = f'model="{prometheus_label(model)}",variant="{prometheus_label(label)}"'
                lines.append(f"carbonledger_variant_batches_total{{{labels}}} {count}")
    return lines
