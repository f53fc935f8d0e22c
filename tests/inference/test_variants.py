"""Model variants picked per batch by load and by the grid state, within the accuracy floor; the grid state
raises the batcher's knob (carbon-aware mode); responses, metrics and the ledger name the variant."""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from inference.config import load_config
from inference.efficiency import EfficiencyPlanner, EfficiencySettings
from inference.gateway import Gateway
from inference.repository import GatewayOptions
from inference.variants import GridState, Variant, VariantPolicy, accuracy_floor, compatible
from tests.inference.test_gateway_http import post_json, static_resolver, url
from tests.support.models import DEMO
from tests.support.servers import serve_asgi

FP32 = Variant("digits", "fp32", 0.9778)
INT8 = Variant("digits_int8", "int8", 0.9733)


def digits_repository(root: Path, floor: str | None = None) -> Path:
    shutil.copytree(DEMO / "digits", root / "digits")
    shutil.copytree(DEMO / "digits_int8", root / "digits_int8")
    if floor is not None:
        config = root / "digits" / "config.pbtxt"
        config.write_text(config.read_text().replace('string_value: "0.995"', f'string_value: "{floor}"'))
    return root


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Gateway, str]]:
    gw = Gateway(digits_repository(tmp_path / "models"), GatewayOptions(), static_resolver)
    with serve_asgi(gw) as address:
        yield gw, address


def digits_doc(rows: int = 1) -> dict[str, object]:
    x = (np.arange(rows * 64, dtype=np.float32) % 17) / 16
    return {"inputs": [{"name": "input", "shape": [rows, 64], "datatype": "FP32", "data": x.tolist()}]}


def test_the_demo_int8_variant_is_within_the_declared_floor_and_linked_to_digits(
    gateway: tuple[Gateway, str],
) -> None:
    gw, _ = gateway
    base = gw.repository.version("digits", None)
    policy = base.variant_policy
    assert policy is not None
    assert [v.model for v in policy.eligible] == ["digits_int8"]
    assert accuracy_floor(base.spec) == 0.995
    assert base.variant == "fp32"
    assert gw.repository.version("digits_int8", None).variant_policy is None  # a variant serves as itself


def test_responses_name_the_variant_the_grid_state_switches_it_and_outputs_are_the_variant_s(
    gateway: tuple[Gateway, str],
) -> None:
    gw, address = gateway
    normal = post_json(address, "/v2/models/digits/infer", digits_doc(2))
    assert normal.status_code == 200
    assert normal.json()["parameters"]["variant"] == "fp32"
    gw.repository.grid.update(420.0, 300.0, "test: hourly series")
    high = post_json(address, "/v2/models/digits/infer", digits_doc(2))
    assert high.json()["parameters"]["variant"] == "int8"
    direct = post_json(address, "/v2/models/digits_int8/infer", digits_doc(2))
    assert direct.json()["parameters"]["variant"] == "int8"
    # Served by int8: exactly what the int8 model itself answers.
    assert high.json()["outputs"] == direct.json()["outputs"]
    gw.repository.grid.update(120.0, 300.0, "test: hourly series")
    assert (
        post_json(address, "/v2/models/digits/infer", digits_doc()).json()["parameters"]["variant"] == "fp32"
    )
    metrics = requests.get(url(address, "/metrics"), timeout=5).text
    assert 'carbonledger_variant_batches_total{model="digits",variant="fp32"} 2' in metrics
    assert 'carbonledger_variant_batches_total{model="digits",variant="int8"} 1' in metrics
    assert "carbonledger_carbon_aware_mode 0" in metrics
    assert "carbonledger_grid_intensity_g_per_kwh 120.0" in metrics


def test_metrics_show_the_carbon_aware_mode_as_unknown_until_the_grid_is_known(
    gateway: tuple[Gateway, str],
) -> None:
    gw, address = gateway
    assert "carbonledger_carbon_aware_mode -1" in requests.get(url(address, "/metrics"), timeout=5).text
    gw.repository.grid.update(500.0, 300.0, "test")
    assert "carbonledger_carbon_aware_mode 1" in requests.get(url(address, "/metrics"), timeout=5).text


def test_a_floor_the_variant_misses_keeps_the_base_model_even_when_the_grid_is_high(tmp_path: Path) -> None:
    gw = Gateway(digits_repository(tmp_path / "models", floor="0.999"), GatewayOptions(), static_resolver)
    with serve_asgi(gw) as address:
        policy = gw.repository.version("digits", None).variant_policy
        assert policy is not None and policy.eligible == []
        gw.repository.grid.update(900.0, 100.0, "test")
        body = post_json(address, "/v2/models/digits/infer", digits_doc()).json()
        assert body["parameters"]["variant"] == "fp32"


@pytest.mark.parametrize(
    ("floor", "message"),
    [("high", "must be a number"), ("1.5", "must be in (0, 1]"), ("0", "must be in (0, 1]")],
)
def test_a_bad_accuracy_floor_keeps_the_model_unloaded_with_the_reason(
    tmp_path: Path, floor: str, message: str
) -> None:
    gw = Gateway(digits_repository(tmp_path / "models", floor=floor), GatewayOptions(), static_resolver)
    with serve_asgi(gw):
        entry = gw.repository.entry("digits")
        assert entry.ready_versions == []
        assert "parameter 'accuracy_floor'" in entry.reason and message in entry.reason
        assert gw.repository.version("digits_int8", None).ready  # the others still serve


def test_a_variant_with_other_outputs_is_not_used(tmp_path: Path) -> None:
    root = digits_repository(tmp_path / "models")
    config = root / "digits_int8" / "config.pbtxt"
    config.write_text(
        re.sub(r"dims: \[ 10 \]", "dims: [ 10 ]", config.read_text()).replace('"label"', '"klass"')
    )
    gw = Gateway(root, GatewayOptions(), static_resolver)
    with serve_asgi(gw):
        policy = gw.repository.version("digits", None).variant_policy
        assert policy is not None and policy.eligible == []


def test_carbon_aware_mode_can_be_switched_off(tmp_path: Path) -> None:
    gw = Gateway(digits_repository(tmp_path / "models"), GatewayOptions(carbon_aware=False), static_resolver)
    with serve_asgi(gw) as address:
        gw.repository.grid.update(900.0, 100.0, "test")
        body = post_json(address, "/v2/models/digits/infer", digits_doc()).json()
        assert body["parameters"]["variant"] == "fp32"


# -- the policy itself ------------------------------------------------------------------------------


def test_high_load_picks_the_cheaper_variant_within_the_floor() -> None:
    policy = VariantPolicy(FP32, [INT8], high_load_rows=64)
    assert policy.choose(10).variant == FP32
    choice = policy.choose(64)
    assert choice.variant == INT8 and "high load" in choice.why
    assert policy.served == {"fp32": 1, "int8": 1}


def test_without_an_eligible_variant_the_base_serves_whatever_the_load() -> None:
    grid = GridState()
    grid.update(900.0, 100.0, "test")
    policy = VariantPolicy(FP32, [], high_load_rows=1, grid=grid)
    assert policy.choose(1000).variant == FP32


def test_the_grid_state_is_high_only_above_a_known_threshold() -> None:
    grid = GridState()
    assert grid.mode == "unknown" and not grid.high
    grid.update(300.0, None, "no threshold set")
    assert grid.mode == "unknown" and not grid.high
    grid.update(300.0, 300.0, "x")
    assert grid.mode == "normal" and not grid.high
    grid.update(300.1, 300.0, "x")
    assert grid.mode == "efficiency" and grid.high


def test_a_high_grid_raises_the_planner_s_knob_to_the_carbon_aware_one() -> None:
    grid = GridState()
    planner = EfficiencyPlanner(
        EfficiencySettings(0.0, 25_000_000), 32, grid=grid, carbon_aware_efficiency=0.8
    )
    assert planner.knob() == 0.0
    assert planner.target(10**10).reason.startswith("knob at 0")
    grid.update(500.0, 200.0, "x")
    assert planner.knob() == 0.8
    planner = EfficiencyPlanner(
        EfficiencySettings(0.9, 25_000_000), 32, grid=grid, carbon_aware_efficiency=0.8
    )
    assert planner.knob() == 0.9  # never lowers the model's own knob


def test_a_model_with_an_objective_gets_a_planner_that_waits_only_while_the_grid_is_high(
    tmp_path: Path,
) -> None:
    root = tmp_path / "models"
    shutil.copytree(DEMO / "linear", root / "linear")
    config = root / "linear" / "config.pbtxt"
    config.write_text(
        config.read_text() + 'parameters { key: "latency_slo_ms" value { string_value: "50" } }\n'
    )
    gw = Gateway(root, GatewayOptions(), static_resolver)
    with serve_asgi(gw):
        batcher = gw.repository.version("linear", None).batcher
        assert batcher is not None and batcher.planner is not None
        assert batcher.planner.knob() == 0.0
        gw.repository.grid.update(500.0, 200.0, "x")
        assert batcher.planner.knob() == 1.0
    assert load_config(root / "linear").parameters["latency_slo_ms"] == "50"


def test_each_instance_of_the_base_runs_its_own_copy_of_the_variant(gateway: tuple[Gateway, str]) -> None:
    gw, _ = gateway
    base = gw.repository.version("digits", None)
    variant = gw.repository.version("digits_int8", None)
    copies = base.variant_backends["digits_int8"]
    assert len(copies) == len(base.backends)
    assert not {id(b) for b in copies} & {id(b) for b in variant.backends}  # never another model's backend


@pytest.mark.parametrize(
    ("parameter", "value", "message"),
    [
        ("variant_high_load_rows", "lots", "'variant_high_load_rows' must be a whole number"),
        ("variant_high_load_rows", "0", "'variant_high_load_rows' must be a whole number"),
        ("variant", "x" * 65, "'variant' is longer than 64"),
    ],
)
def test_bad_variant_parameters_keep_that_model_unloaded_and_the_others_serving(
    tmp_path: Path, parameter: str, value: str, message: str
) -> None:
    root = digits_repository(tmp_path / "models")
    config = root / "digits" / "config.pbtxt"
    config.write_text(
        config.read_text() + f'parameters: {{ key: "{parameter}" value: {{ string_value: "{value}" }} }}\n'
    )
    gw = Gateway(root, GatewayOptions(), static_resolver)
    with serve_asgi(gw):
        entry = gw.repository.entry("digits")
        assert entry.ready_versions == [] and message in entry.reason
        assert gw.repository.version("digits_int8", None).ready


def test_a_variant_on_another_kind_of_device_is_not_used(tmp_path: Path) -> None:
    root = digits_repository(tmp_path / "models")
    config = root / "digits_int8" / "config.pbtxt"
    config.write_text(config.read_text().replace("count: 1", "count: 2"))  # still CPU: usable
    gw = Gateway(root, GatewayOptions(), static_resolver)
    with serve_asgi(gw):
        policy = gw.repository.version("digits", None).variant_policy
        assert policy is not None and [v.model for v in policy.eligible] == ["digits_int8"]
    base = load_config(root / "digits")
    int8 = load_config(root / "digits_int8")
    assert compatible(base, int8) == ""
    on_gpu = dataclasses.replace(
        int8, config_dict={**int8.config_dict, "instance_group": [{"count": 1, "kind": "KIND_GPU"}]}
    )
    assert "runs on ('KIND_GPU',)" in compatible(base, on_gpu)


def test_a_grid_that_becomes_unknown_mid_choice_never_fails_a_batch() -> None:
    grid = GridState()
    policy = VariantPolicy(FP32, [INT8], high_load_rows=64, grid=grid)
    grid.update(500.0, 100.0, "x")
    assert policy.choose(0).variant == INT8
    grid.update(None, 100.0, "no figure this hour")
    assert policy.choose(0).variant == FP32
