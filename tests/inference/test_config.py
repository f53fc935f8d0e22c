"""config.pbtxt parsing in inference/config.py (Triton's protobuf ModelConfig), without Django.

The JSON form must read like Triton's ``GET /v2/models/<m>/config``; TRITON_LINEAR_CONFIG is the
body captured from Triton 2.51.0 in the Triton reference's kserve_v2_examples.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.backends import backend_name
from inference.config import (
    CONFIG_TO_KSERVE,
    ConfigError,
    ModelSpec,
    QueuePolicySpec,
    config_json_bytes,
    default_model_filename,
    load_config,
    parse_config_text,
)

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "inference" / "demo_repository"
REFERENCE = ROOT.parent / "shared" / "triton-reference"
EXAMPLES = REFERENCE / "kserve_v2_examples.md"

TRITON_LINEAR_CONFIG = (
    '{"name":"linear","platform":"","backend":"python","runtime":"","version_policy":{"latest":{"num_versions":1}},'
    '"max_batch_size":32,"input":[{"name":"x","data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[256],'
    '"is_shape_tensor":false,"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false}],'
    '"output":[{"name":"y","data_type":"TYPE_FP32","dims":[256],"label_filename":"","is_shape_tensor":false,'
    '"is_non_linear_format_io":false}],"batch_input":[],"batch_output":[],"optimization":{"priority":'
    '"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},"output_pinned_memory":{"enable":true},'
    '"gather_kernel_buffer_threshold":0,"eager_batching":false},"dynamic_batching":{"preferred_batch_size":'
    '[8,16,32],"max_queue_delay_microseconds":2000,"preserve_ordering":false,"priority_levels":0,'
    '"default_priority_level":0,"priority_queue_policy":{}},"instance_group":[{"name":"linear_0","kind":'
    '"KIND_CPU","count":1,"gpus":[],"secondary_devices":[],"profile":[],"passive":false,"host_policy":""}],'
    '"default_model_filename":"model.py","cc_model_filenames":{},"metric_tags":{},"parameters":{},'
    '"model_warmup":[]}'
)

BASE = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]
"""

PATH = Path("/repo/m/config.pbtxt")


def _parse(text: str, dir_name: str = "m") -> ModelSpec:
    return parse_config_text(text, Path(f"/repo/{dir_name}/config.pbtxt"), dir_name)


def _error(text: str, dir_name: str = "m") -> str:
    with pytest.raises(ConfigError) as info:
        _parse(text, dir_name)
    msg = str(info.value)
    assert msg.startswith(f"/repo/{dir_name}/config.pbtxt: "), msg  # names the file
    return msg


def _triton() -> dict[str, object]:
    doc: dict[str, object] = json.loads(TRITON_LINEAR_CONFIG)
    return doc


def _reference_linear_dir() -> Path:
    path = REFERENCE / "models" / "linear"
    if not (path / "config.pbtxt").is_file():
        pytest.skip(f"{path} is not checked out beside the project")
    return path


# ---------------------------------------------------------------------------------------------
# the JSON form reads like Triton's /config


def test_captured_triton_config_constant_matches_the_reference_capture() -> None:
    if not EXAMPLES.is_file():
        pytest.skip(f"{EXAMPLES} is not checked out beside the project")
    text = EXAMPLES.read_text(encoding="utf-8")
    section = text[text.index("### GET /v2/models/linear/config") :]
    line = next(x for x in section.splitlines() if x.startswith('{"name":"linear"'))
    assert json.loads(line) == _triton()


def test_reference_config_json_matches_triton_config_response_fields() -> None:
    spec = load_config(_reference_linear_dir())
    ours = spec.config_dict
    triton = _triton()
    assert ours["name"] == "linear"
    assert ours["max_batch_size"] == 32
    assert ours["input"][0]["dims"] == [256]
    assert all(type(d) is int for d in ours["input"][0]["dims"])  # numbers, not proto3 strings
    assert ours["output"][0]["dims"] == [256]
    assert ours["dynamic_batching"]["preferred_batch_size"] == [8, 16, 32]
    assert ours["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert type(ours["dynamic_batching"]["max_queue_delay_microseconds"]) is int
    assert ours["instance_group"][0]["name"] == "linear_0"
    assert ours["instance_group"][0]["count"] == 1
    assert ours["instance_group"][0]["kind"] == "KIND_CPU"
    assert ours["version_policy"] == {"latest": {"num_versions": 1}}
    assert ours["default_model_filename"] == "model.py"
    for key in (
        "name",
        "platform",
        "backend",
        "max_batch_size",
        "input",
        "output",
        "dynamic_batching",
        "instance_group",
        "version_policy",
        "default_model_filename",
    ):
        assert ours[key] == triton[key], key


def test_reference_config_json_equals_triton_except_the_optimization_block() -> None:
    ours = load_config(_reference_linear_dir()).config_dict
    triton = _triton()
    # Triton auto-fills 'optimization' from its defaults; the gateway leaves it unset.
    differing = sorted(k for k in set(ours) | set(triton) if ours.get(k) != triton.get(k))
    assert differing == ["optimization"]


def test_demo_linear_config_json_equals_triton_except_the_optimization_block() -> None:
    ours = load_config(DEMO / "linear").config_dict
    triton = _triton()
    assert {k: v for k, v in ours.items() if k != "optimization"} == {
        k: v for k, v in triton.items() if k != "optimization"
    }


def test_config_json_bytes_are_compact_and_round_trip() -> None:
    spec = load_config(DEMO / "linear")
    raw = config_json_bytes(spec)
    assert b": " not in raw and b", " not in raw
    assert json.loads(raw) == spec.config_dict


def test_reference_config_parses_into_the_spec() -> None:
    spec = load_config(DEMO / "linear")
    assert spec.name == "linear"
    assert spec.backend == "python"
    assert spec.platform == ""
    assert spec.max_batch_size == 32
    assert spec.batching is True
    assert [(t.name, t.datatype, t.dims) for t in spec.inputs] == [("x", "FP32", (256,))]
    assert [(t.name, t.datatype, t.dims) for t in spec.outputs] == [("y", "FP32", (256,))]
    assert spec.input("x") is spec.inputs[0]
    assert spec.input("y") is None
    assert spec.output("y") is spec.outputs[0]
    assert spec.output("x") is None
    db = spec.dynamic_batching
    assert db is not None
    assert db.preferred_batch_size == (8, 16, 32)
    assert db.max_queue_delay_us == 2000
    assert db.preserve_ordering is False
    assert db.priority_levels == 0
    assert db.default_queue_policy == QueuePolicySpec()
    assert db.priority_queue_policy == {}
    assert spec.instance_count == 1
    assert spec.version_policy == {"latest": {"num_versions": 1}}
    assert spec.parameters == {}


def test_onnx_platform_fills_backend_and_default_filename() -> None:
    spec = load_config(DEMO / "digits")
    assert spec.platform == "onnxruntime_onnx"
    assert spec.backend == "onnxruntime"
    assert spec.config_dict["default_model_filename"] == "model.onnx"
    assert spec.config_dict["instance_group"][0]["name"] == "digits_0"
    assert spec.parameters["variant"] == "fp32"
    assert spec.config_dict["parameters"]["variant"] == {"string_value": "fp32"}
    assert [(t.name, t.datatype, t.dims) for t in spec.outputs] == [
        ("probabilities", "FP32", (10,)),
        ("label", "INT64", (1,)),
    ]
    assert spec.dynamic_batching is not None
    assert spec.dynamic_batching.preferred_batch_size == (16, 64)


def test_default_model_filename_per_backend() -> None:
    assert default_model_filename("", "python") == "model.py"
    assert default_model_filename("onnxruntime_onnx", "") == "model.onnx"
    assert default_model_filename("", "onnxruntime") == "model.onnx"
    assert default_model_filename("tensorrt_plan", "") == ""


def test_explicit_default_model_filename_is_kept() -> None:
    spec = _parse(BASE + 'default_model_filename: "net.py"\n')
    assert spec.config_dict["default_model_filename"] == "net.py"


def test_missing_name_takes_the_directory_name() -> None:
    spec = _parse(BASE.replace('name: "m"', ""), "fromdir")
    assert spec.name == "fromdir"
    assert spec.config_dict["name"] == "fromdir"
    assert spec.config_dict["instance_group"][0]["name"] == "fromdir_0"


def test_missing_instance_group_defaults_to_one_cpu_instance() -> None:
    spec = _parse(BASE)
    assert spec.instance_count == 1
    group = spec.config_dict["instance_group"]
    assert len(group) == 1
    assert group[0]["name"] == "m_0"
    assert group[0]["count"] == 1
    assert group[0]["kind"] == "KIND_CPU"


def test_instance_groups_are_named_and_counted() -> None:
    spec = _parse(BASE + "instance_group [ { count: 2, kind: KIND_CPU }, { count: 0, kind: KIND_CPU } ]\n")
    assert [g["name"] for g in spec.config_dict["instance_group"]] == ["m_0", "m_1"]
    assert [g["count"] for g in spec.config_dict["instance_group"]] == [2, 1]  # count 0 means 1
    assert spec.instance_count == 3


def test_named_instance_group_keeps_its_name() -> None:
    spec = _parse(BASE + 'instance_group [ { name: "gpu_pool", count: 1, kind: KIND_CPU } ]\n')
    assert spec.config_dict["instance_group"][0]["name"] == "gpu_pool"


def test_no_max_batch_size_means_no_batching() -> None:
    spec = _parse(BASE.replace("max_batch_size: 8", ""))
    assert spec.max_batch_size == 0
    assert spec.batching is False
    assert spec.dynamic_batching is None


def test_dynamic_batching_without_preferred_sizes_prefers_max_batch_size() -> None:
    spec = _parse(BASE + "dynamic_batching { }\n")
    assert spec.dynamic_batching is not None
    assert spec.dynamic_batching.preferred_batch_size == (8,)
    assert spec.dynamic_batching.max_queue_delay_us == 0
    assert spec.config_dict["dynamic_batching"]["preferred_batch_size"] == []  # as Triton writes it


def test_preferred_batch_sizes_are_sorted() -> None:
    spec = _parse(BASE + "dynamic_batching { preferred_batch_size: [ 8, 2, 4 ] }\n")
    assert spec.dynamic_batching is not None
    assert spec.dynamic_batching.preferred_batch_size == (2, 4, 8)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", {"latest": {"num_versions": 1}}),
        ("version_policy { latest { num_versions: 2 } }", {"latest": {"num_versions": 2}}),
        ("version_policy { all { } }", {"all": {}}),
        ("version_policy { specific { versions: [ 1, 3 ] } }", {"specific": {"versions": [1, 3]}}),
    ],
)
def test_version_policy_is_parsed(policy: str, expected: dict[str, object]) -> None:
    spec = _parse(BASE + policy + "\n")
    assert spec.version_policy == expected
    assert spec.config_dict["version_policy"] == expected


def test_every_config_datatype_maps_to_its_kserve_name() -> None:
    inputs = ", ".join(
        f'{{ name: "i{n}", data_type: {t}, dims: [ 1 ] }}' for n, t in enumerate(CONFIG_TO_KSERVE)
    )
    spec = _parse(
        BASE.replace('input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]', f"input [ {inputs} ]")
    )
    assert [t.datatype for t in spec.inputs] == list(CONFIG_TO_KSERVE.values())
    assert spec.input("i0") is not None
    assert {t.datatype for t in spec.inputs} >= {"BYTES", "BF16", "BOOL"}


def test_variable_and_optional_dims_parse() -> None:
    spec = _parse(
        BASE.replace(
            'input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]',
            'input [ { name: "x", data_type: TYPE_INT64, dims: [ -1, 3 ] }, '
            '{ name: "m", data_type: TYPE_BOOL, dims: [ -1 ], optional: true } ]',
        )
    )
    x, m = spec.inputs
    assert x.dims == (-1, 3)
    assert x.optional is False
    assert m.optional is True
    assert spec.config_dict["input"][0]["dims"] == [-1, 3]


# ---------------------------------------------------------------------------------------------
# priority levels and queue policies

PRIORITY_DEFAULT_POLICY = """
dynamic_batching {
  preferred_batch_size: [ 4 ]
  max_queue_delay_microseconds: 500
  preserve_ordering: true
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 100000
    allow_timeout_override: true
    max_queue_size: 10
  }
}
"""


def test_priority_levels_and_default_queue_policy_parse_into_the_spec() -> None:
    spec = _parse(BASE + PRIORITY_DEFAULT_POLICY)
    db = spec.dynamic_batching
    assert db is not None
    assert db.preserve_ordering is True
    assert db.priority_levels == 3
    assert db.default_priority_level == 2
    assert db.default_queue_policy == QueuePolicySpec(
        timeout_action="DELAY", default_timeout_us=100000, allow_timeout_override=True, max_queue_size=10
    )
    js = spec.config_dict["dynamic_batching"]
    assert js["priority_levels"] == 3
    assert js["default_queue_policy"] == {
        "timeout_action": "DELAY",
        "default_timeout_microseconds": 100000,
        "allow_timeout_override": True,
        "max_queue_size": 10,
    }


def test_queue_policy_defaults_to_reject_without_timeout() -> None:
    spec = _parse(BASE + "dynamic_batching { priority_levels: 2 default_priority_level: 1 }\n")
    assert spec.dynamic_batching is not None
    assert spec.dynamic_batching.default_queue_policy == QueuePolicySpec("REJECT", 0, False, 0)


PRIORITY_QUEUE_POLICY = """
dynamic_batching {
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 9000 }
  priority_queue_policy {
    key: 1
    value { timeout_action: REJECT default_timeout_microseconds: 5000 allow_timeout_override: true max_queue_size: 3 }
  }
}
"""


def test_priority_queue_policy_parses_into_the_spec() -> None:
    spec = _parse(BASE + PRIORITY_QUEUE_POLICY)
    db = spec.dynamic_batching
    assert db is not None
    assert db.priority_queue_policy == {
        1: QueuePolicySpec(
            timeout_action="REJECT", default_timeout_us=5000, allow_timeout_override=True, max_queue_size=3
        )
    }
    assert db.default_queue_policy == QueuePolicySpec(timeout_action="DELAY", default_timeout_us=9000)
    # Triton writes map keys as JSON strings and the uint64 timeout as a number.
    assert (
        spec.config_dict["dynamic_batching"]["priority_queue_policy"]["1"]["default_timeout_microseconds"]
        == 5000
    )


def test_priority_queue_policy_for_a_level_outside_the_levels_is_an_error() -> None:
    msg = _error(
        BASE
        + "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
        + "priority_queue_policy { key: 5 value { max_queue_size: 1 } } }\n"
    )
    assert "priority_queue_policy names level 5, outside 1..2" in msg


@pytest.mark.parametrize("level", [0, 3])
def test_default_priority_level_outside_the_levels_is_an_error(level: int) -> None:
    msg = _error(BASE + f"dynamic_batching {{ priority_levels: 2 default_priority_level: {level} }}\n")
    assert "default_priority_level must be between 1 and priority_levels (2)" in msg


# ---------------------------------------------------------------------------------------------
# errors name the file and the problem


def test_garbage_text_is_a_config_error() -> None:
    msg = _error("this is { not a : config")
    assert len(msg) > len("/repo/m/config.pbtxt: ")


def test_unknown_field_is_a_config_error() -> None:
    msg = _error(BASE + "max_batch_sise: 4\n")
    assert "max_batch_sise" in msg


def test_name_not_matching_the_directory_is_an_error() -> None:
    msg = _error(BASE, "linear")
    assert "name 'm' does not match the model directory 'linear'" in msg


def test_dynamic_batching_with_max_batch_size_zero_is_an_error() -> None:
    msg = _error(BASE.replace("max_batch_size: 8", "max_batch_size: 0") + "dynamic_batching { }\n")
    assert "dynamic_batching needs max_batch_size > 0" in msg


def test_negative_max_batch_size_is_an_error() -> None:
    msg = _error(BASE.replace("max_batch_size: 8", "max_batch_size: -1"))
    assert "max_batch_size must be >= 0, got -1" in msg


@pytest.mark.parametrize("size", [9, 64])
def test_preferred_size_above_max_batch_size_is_an_error(size: int) -> None:
    msg = _error(BASE + f"dynamic_batching {{ preferred_batch_size: [ 4, {size} ] }}\n")
    assert f"preferred_batch_size {size} must be between 1 and max_batch_size 8" in msg


def test_preferred_size_zero_is_an_error() -> None:
    assert "preferred_batch_size 0 must be between 1" in _error(
        BASE + "dynamic_batching { preferred_batch_size: [ 0 ] }\n"
    )


def test_no_inputs_is_an_error() -> None:
    msg = _error(BASE.replace('input [ { name: "x", data_type: TYPE_FP32, dims: [ 4 ] } ]', ""))
    assert "the model declares no input" in msg


def test_no_outputs_is_an_error() -> None:
    msg = _error(BASE.replace('output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]', ""))
    assert "the model declares no output" in msg


def test_missing_backend_and_platform_is_an_error() -> None:
    msg = _error(BASE.replace('backend: "python"', ""))
    assert "neither 'backend' nor 'platform' is set" in msg


def test_input_without_a_data_type_is_an_error() -> None:
    msg = _error(BASE.replace("data_type: TYPE_FP32, dims: [ 4 ] } ]\noutput", "dims: [ 4 ] } ]\noutput"))
    assert "input 'x' has unsupported data_type TYPE_INVALID" in msg


def test_unsupported_backend_is_left_to_the_backend_registry() -> None:
    # Not a config error: a model served by a remote Triton may name any backend.
    spec = _parse(BASE.replace('backend: "python"', 'backend: "tensorrt"'))
    with pytest.raises(ValueError, match=r"model 'm': no backend for backend='tensorrt' platform=''"):
        backend_name(spec)
    remote = _parse(
        BASE.replace('backend: "python"', 'backend: "tensorrt"')
        + 'parameters { key: "remote" value { string_value: "triton" } }\n'
    )
    assert backend_name(remote) == "triton"


def test_unsupported_platform_is_left_to_the_backend_registry() -> None:
    spec = _parse(BASE.replace('backend: "python"', 'platform: "tensorflow_savedmodel"'))
    assert spec.platform == "tensorflow_savedmodel"
    with pytest.raises(ValueError, match="platform='tensorflow_savedmodel'"):
        backend_name(spec)


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match=r"config\.pbtxt is missing"):
        load_config(tmp_path / "m")


def test_unreadable_config_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_bytes(b'name: "m"\n\xff\xfe')
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "m")
    assert str(info.value).startswith(f"{tmp_path / 'm' / 'config.pbtxt'}: cannot read")


def test_load_config_error_names_the_file_on_disk(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text("garbage {", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "m")
    assert str(tmp_path / "m" / "config.pbtxt") in str(info.value)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# ---------------------------------------------------------------------------------------------
# param_bool


def _with_param(value: str) -> ModelSpec:
    return _parse(BASE + f'parameters {{ key: "adaptive_delay" value {{ string_value: "{value}" }} }}\n')


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "On", " true "])
def test_param_bool_true_spellings(value: str) -> None:
    assert _with_param(value).param_bool("adaptive_delay", False) is True


@pytest.mark.parametrize("value", ["0", "false", "False", "no", "OFF", " off\t"])
def test_param_bool_false_spellings(value: str) -> None:
    assert _with_param(value).param_bool("adaptive_delay", True) is False


def test_param_bool_absent_gives_the_default() -> None:
    spec = _parse(BASE)
    assert spec.param_bool("adaptive_delay", True) is True
    assert spec.param_bool("adaptive_delay", False) is False


@pytest.mark.parametrize("value", ["maybe", "", "2"])
def test_param_bool_other_text_is_a_config_error(value: str) -> None:
    spec = _with_param(value)
    with pytest.raises(ConfigError) as info:
        spec.param_bool("adaptive_delay", True)
    assert str(info.value) == f"model 'm': parameter 'adaptive_delay' must be true or false, got {value!r}"


def test_parameters_are_read_as_strings() -> None:
    spec = _parse(
        BASE
        + 'parameters { key: "a" value { string_value: "1" } }\n'
        + 'parameters { key: "b" value { string_value: "text" } }\n'
    )
    assert spec.parameters == {"a": "1", "b": "text"}
