"""Model configuration: Triton's ``config.pbtxt`` parsed with Triton's own protobuf schema.

No hand-written parser: ``tritonclient.grpc.model_config_pb2.ModelConfig`` and
``google.protobuf.text_format`` read the file, so any config Triton accepts reads the same here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2

from inference.values import parse_bool

# Triton config data types -> KServe v2 datatypes.
CONFIG_TO_KSERVE: dict[str, str] = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}

_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


class ConfigError(ValueError):
    """A config.pbtxt that cannot be used; the message names the file and what is wrong."""


def parameter_number(spec: Any, key: str) -> float | None:
    """A finite number from the model's ``parameters``; None when absent or empty. Raises ConfigError naming
    the model and the parameter."""
    raw = spec.parameters.get(key)
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"model '{spec.name}': parameter '{key}' must be a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ConfigError(f"model '{spec.name}': parameter '{key}' must be finite, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str  # KServe datatype, e.g. "FP32"
    dims: tuple[int, ...]  # without the batch dimension when max_batch_size > 0
    optional: bool = False


@dataclass(frozen=True, slots=True)
class QueuePolicySpec:
    timeout_action: str = "REJECT"  # or "DELAY"
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0: unbounded


@dataclass(frozen=True, slots=True)
class DynamicBatchingSpec:
    preferred_batch_size: tuple[int, ...]
    max_queue_delay_us: int
    preserve_ordering: bool
    priority_levels: int
    default_priority_level: int
    default_queue_policy: QueuePolicySpec
    priority_queue_policy: dict[int, QueuePolicySpec]


@dataclass(frozen=True, slots=True)
class InstancePlacement:
    """Where one model instance runs: ``kind`` as in ``instance_group`` (KIND_CPU, KIND_GPU, KIND_AUTO,
    KIND_MODEL) and, for KIND_GPU, the CUDA device index."""

    kind: str
    gpu: int | None = None

    @property
    def device(self) -> str:
        """``cpu`` or ``cuda:N``, as PyTorch names devices."""
        return "cpu" if self.gpu is None else f"cuda:{self.gpu}"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What the gateway needs of one model's config, plus Triton's JSON form of it."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    dynamic_batching: DynamicBatchingSpec | None
    instance_count: int
    version_policy: dict[str, Any]
    parameters: dict[str, str]
    config_dict: dict[str, Any] = field(repr=False)
    # One entry per model instance, in instance order (len == instance_count).
    instances: tuple[InstancePlacement, ...] = ()

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    def input(self, name: str) -> TensorSpec | None:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        return None

    def output(self, name: str) -> TensorSpec | None:
        for spec in self.outputs:
            if spec.name == name:
                return spec
        return None

    def param_bool(self, key: str, default: bool) -> bool:
        raw = self.parameters.get(key)
        if raw is None:
            return default
        value = parse_bool(raw)
        if value is None:
            raise ConfigError(f"model '{self.name}': parameter '{key}' must be true or false, got {raw!r}")
        return value


def _ints_as_numbers(message: Message, data: dict[str, Any]) -> dict[str, Any]:
    """MessageToDict writes int64 fields as strings (proto3 JSON); Triton writes numbers."""
    for fd in message.DESCRIPTOR.fields:
        key = fd.name
        if key not in data:
            continue
        value = getattr(message, key)
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if fd.message_type.GetOptions().map_entry:
                value_fd = fd.message_type.fields_by_name["value"]
                if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                    # JSON map keys are strings; the protobuf map may be keyed by integers.
                    for mk, mv in value.items():
                        data[key][str(mk)] = _ints_as_numbers(mv, data[key][str(mk)])
                elif value_fd.type in _INT64_TYPES:
                    data[key] = {k: int(v) for k, v in data[key].items()}
            elif fd.is_repeated:
                data[key] = [_ints_as_numbers(m, d) for m, d in zip(value, data[key], strict=True)]
            else:
                data[key] = _ints_as_numbers(value, data[key])
        elif fd.type in _INT64_TYPES:
            if fd.is_repeated:
                data[key] = [int(v) for v in data[key]]
            else:
                data[key] = int(data[key])
    return data


def _queue_policy(policy: Any) -> QueuePolicySpec:
    action = model_config_pb2.ModelQueuePolicy.TimeoutAction.Name(policy.timeout_action)
    return QueuePolicySpec(
        timeout_action=action,
        default_timeout_us=int(policy.default_timeout_microseconds),
        allow_timeout_override=bool(policy.allow_timeout_override),
        max_queue_size=int(policy.max_queue_size),
    )


def _tensor(t: Any, what: str, path: Path) -> TensorSpec:
    dtype_name = model_config_pb2.DataType.Name(t.data_type)
    if dtype_name not in CONFIG_TO_KSERVE:
        raise ConfigError(f"{path}: {what} '{t.name}' has unsupported data_type {dtype_name}")
    dims = tuple(int(d) for d in t.dims)
    return TensorSpec(
        name=t.name,
        datatype=CONFIG_TO_KSERVE[dtype_name],
        dims=dims,
        optional=bool(getattr(t, "optional", False)),
    )


def default_model_filename(platform: str, backend: str) -> str:
    if backend == "python":
        return "model.py"
    if platform == "onnxruntime_onnx" or backend == "onnxruntime":
        return "model.onnx"
    if platform == "pytorch_libtorch" or backend == "pytorch":
        return "model.pt"
    return ""


def _placements(cfg: Any, path: Path) -> tuple[InstancePlacement, ...]:
    """Triton's placement: a KIND_GPU group puts ``count`` instances on EACH of its ``gpus``; without ``gpus``
    (Triton: every visible GPU) this framework-free core cannot see the devices, so it takes GPU 0."""
    out: list[InstancePlacement] = []
    for group in cfg.instance_group:
        kind = model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)
        gpus = [int(g) for g in group.gpus]
        if any(g < 0 for g in gpus):
            raise ConfigError(f"{path}: instance_group '{group.name}' lists a negative GPU id {gpus}")
        if gpus and kind != "KIND_GPU":
            raise ConfigError(f"{path}: instance_group '{group.name}' is {kind} but lists gpus {gpus}")
        if kind == "KIND_GPU":
            out += [InstancePlacement(kind, gpu) for gpu in (gpus or [0]) for _ in range(group.count)]
        else:
            out += [InstancePlacement(kind) for _ in range(group.count)]
    return tuple(out)


def parse_config_text(text: str, path: Path, dir_name: str) -> ModelSpec:
    """Parse ``config.pbtxt`` text into a ModelSpec, filling Triton's defaults."""
    cfg = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    if not cfg.name:
        cfg.name = dir_name
    elif cfg.name != dir_name:
        raise ConfigError(f"{path}: name '{cfg.name}' does not match the model directory '{dir_name}'")
    if cfg.max_batch_size < 0:
        raise ConfigError(f"{path}: max_batch_size must be >= 0, got {cfg.max_batch_size}")
    if not cfg.input:
        raise ConfigError(f"{path}: the model declares no input")
    if not cfg.output:
        raise ConfigError(f"{path}: the model declares no output")
    if cfg.platform == "onnxruntime_onnx" and not cfg.backend:
        cfg.backend = "onnxruntime"
    if cfg.platform == "pytorch_libtorch" and not cfg.backend:
        cfg.backend = "pytorch"
    if not cfg.backend and not cfg.platform:
        raise ConfigError(f"{path}: neither 'backend' nor 'platform' is set")

    # Triton's auto-completed defaults, so that /config reads like Triton's.
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
    if not cfg.instance_group:
        group = cfg.instance_group.add()
        group.count = 1
        group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
    for i, group in enumerate(cfg.instance_group):
        if not group.name:
            group.name = f"{cfg.name}_{i}" if len(cfg.instance_group) > 1 else f"{cfg.name}_0"
        if group.count < 1:
            group.count = 1
    if not cfg.default_model_filename:
        cfg.default_model_filename = default_model_filename(cfg.platform, cfg.backend)

    batching: DynamicBatchingSpec | None = None
    if cfg.HasField("dynamic_batching"):
        if cfg.max_batch_size == 0:
            raise ConfigError(f"{path}: dynamic_batching needs max_batch_size > 0")
        db = cfg.dynamic_batching
        preferred = tuple(sorted(int(p) for p in db.preferred_batch_size))
        for p in preferred:
            if p < 1 or p > cfg.max_batch_size:
                raise ConfigError(
                    f"{path}: preferred_batch_size {p} must be between 1 and max_batch_size {cfg.max_batch_size}"
                )
        levels = int(db.priority_levels)
        if levels and not (1 <= db.default_priority_level <= levels):
            raise ConfigError(
                f"{path}: default_priority_level must be between 1 and priority_levels ({levels})"
            )
        for level in db.priority_queue_policy:
            if not (1 <= level <= levels):
                raise ConfigError(f"{path}: priority_queue_policy names level {level}, outside 1..{levels}")
        default_policy = _queue_policy(db.default_queue_policy)
        batching = DynamicBatchingSpec(
            preferred_batch_size=preferred or (cfg.max_batch_size,),
            max_queue_delay_us=int(db.max_queue_delay_microseconds),
            preserve_ordering=bool(db.preserve_ordering),
            priority_levels=levels,
            default_priority_level=int(db.default_priority_level),
            default_queue_policy=default_policy,
            priority_queue_policy={int(k): _queue_policy(v) for k, v in db.priority_queue_policy.items()},
        )

    inputs = tuple(_tensor(t, "input", path) for t in cfg.input)
    outputs = tuple(_tensor(t, "output", path) for t in cfg.output)
    placements = _placements(cfg, path)
    params = {k: v.string_value for k, v in cfg.parameters.items()}
    as_dict = json_format.MessageToDict(
        cfg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    as_dict = _ints_as_numbers(cfg, as_dict)
    vp = as_dict.get("version_policy", {"latest": {"num_versions": 1}})
    return ModelSpec(
        name=cfg.name,
        platform=cfg.platform,
        backend=cfg.backend,
        max_batch_size=int(cfg.max_batch_size),
        inputs=inputs,
        outputs=outputs,
        dynamic_batching=batching,
        instance_count=len(placements),
        version_policy=vp,
        parameters=params,
        config_dict=as_dict,
        instances=placements,
    )


def load_config(model_dir: Path) -> ModelSpec:
    path = model_dir / "config.pbtxt"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: config.pbtxt is missing") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    return parse_config_text(text, path, model_dir.name)


def config_json_bytes(spec: ModelSpec) -> bytes:
    return json.dumps(spec.config_dict, separators=(",", ":")).encode()
