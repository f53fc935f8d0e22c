"""The gateway over real HTTP on a loopback port: tritonclient (sync and asyncio), raw requests
for the bad-input cases, and the promise that the server keeps serving after each of them.

No Django here: API keys come from a static resolver; the database-backed resolver is tested
in tests/carbonledger/test_gateway_keys.py.
"""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient

from inference.gateway import Gateway
from inference.keys import Principal
from inference.repository import GatewayOptions
from tests.support.models import DEMO, build_test_repository, linear_reference
from tests.support.servers import free_port, serve_asgi

INFER_KEY = "test-infer-key"
READ_KEY = "test-read-only-key"
AUTH = {"Authorization": f"Bearer {INFER_KEY}"}
MAX_BODY = 1024 * 1024

PRINCIPALS = {
    INFER_KEY: Principal(1, "acme", 10, frozenset({"infer", "read"})),
    READ_KEY: Principal(1, "acme", 11, frozenset({"read"})),
}


async def static_resolver(token: str) -> Principal | None:
    return PRINCIPALS.get(token)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = build_test_repository(tmp_path_factory.mktemp("models"), f"127.0.0.1:{free_port()}")
    options = GatewayOptions(max_body_bytes=MAX_BODY, remote_timeout_s=1.0)
    gateway = Gateway(repo, options, static_resolver)
    with serve_asgi(gateway) as address:
        yield address


def url(server: str, path: str) -> str:
    return f"http://{server}{path}"


def post_json(
    server: str, path: str, doc: object, headers: dict[str, str] | None = None
) -> requests.Response:
    return requests.post(
        url(server, path), data=json.dumps(doc), headers={**AUTH, **(headers or {})}, timeout=10
    )


def linear_doc(rows: int = 1, **extra: object) -> dict[str, object]:
    x = np.arange(rows * 256, dtype=np.float32) / 512
    return {"inputs": [{"name": "x", "shape": [rows, 256], "datatype": "FP32", "data": x.tolist()}], **extra}


def assert_still_serving(server: str) -> None:
    r = post_json(server, "/v2/models/linear/infer", linear_doc())
    assert r.status_code == 200, r.text


# -- health, metadata, config ----------------------------------------------------------------


def test_health_live_is_empty_200_and_ready_reflects_the_broken_model(server: str) -> None:
    live = requests.get(url(server, "/v2/health/live"), timeout=5)
    assert (live.status_code, live.content, live.headers["content-type"]) == (200, b"", "text/plain")
    ready = requests.get(url(server, "/v2/health/ready"), timeout=5)
    assert ready.status_code == 400  # like Triton: one model failed to load


def test_health_needs_no_key_but_metadata_does(server: str) -> None:
    assert requests.get(url(server, "/v2/health/live"), timeout=5).status_code == 200
    r = requests.get(url(server, "/v2/models/linear"), timeout=5)
    assert r.status_code == 401
    assert "Authorization: Bearer" in r.json()["error"]


def test_tritonclient_reads_metadata_and_config_like_tritons(server: str) -> None:
    client = httpclient.InferenceServerClient(server)
    assert client.is_server_live()
    meta = client.get_model_metadata("linear", headers=AUTH)
    assert meta == {
        "name": "linear",
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 256]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 256]}],
    }
    config = client.get_model_config("linear", headers=AUTH)
    assert config["max_batch_size"] == 32
    assert config["input"][0]["dims"] == [256]
    assert config["dynamic_batching"]["preferred_batch_size"] == [8, 16, 32]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert config["instance_group"][0]["name"] == "linear_0"
    assert client.is_model_ready("linear", headers=AUTH)
    client.close()


def test_server_metadata_names_the_extensions(server: str) -> None:
    r = requests.get(url(server, "/v2"), headers=AUTH, timeout=5)
    assert r.status_code == 200
    assert "binary_tensor_data" in r.json()["extensions"]


def test_broken_model_is_not_ready_with_its_reason_and_others_load(server: str) -> None:
    r = requests.get(url(server, "/v2/models/broken/ready"), headers=AUTH, timeout=5)
    assert r.status_code == 400
    assert "not ready" in r.json()["error"] and "config.pbtxt" in r.json()["error"]
    index = requests.post(url(server, "/v2/repository/index"), headers=AUTH, data="{}", timeout=5).json()
    states = {row["name"]: row for row in index}
    assert states["broken"]["state"] == "UNAVAILABLE"
    assert "max_batch_size" in states["broken"]["reason"]
    assert states["linear"]["state"] == "READY"


# -- inference ---------------------------------------------------------------------------------


def test_tritonclient_binary_inference_matches_the_reference_arithmetic(server: str) -> None:
    client = httpclient.InferenceServerClient(server)
    x = np.random.default_rng(3).standard_normal((3, 256), dtype=np.float32)
    inp = httpclient.InferInput("x", [3, 256], "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    out = httpclient.InferRequestedOutput("y", binary_data=True)
    result = client.infer("linear", [inp], outputs=[out], headers=dict(AUTH), request_id="r-7")
    np.testing.assert_allclose(result.as_numpy("y"), linear_reference(x), rtol=1e-5, atol=1e-5)
    assert result.get_response()["id"] == "r-7"
    client.close()


def test_json_and_binary_outputs_are_bit_identical(server: str) -> None:
    doc = linear_doc(2)
    as_json = post_json(server, "/v2/models/linear/infer", doc).json()
    doc["outputs"] = [{"name": "y", "parameters": {"binary_data": True}}]
    as_binary = post_json(server, "/v2/models/linear/infer", doc)
    header_len = int(as_binary.headers["inference-header-content-length"])
    header = json.loads(as_binary.content[:header_len])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 2 * 256 * 4
    binary = np.frombuffer(as_binary.content[header_len:], dtype="<f4")
    assert np.array_equal(np.array(as_json["outputs"][0]["data"], dtype=np.float32), binary)


def test_nested_json_data_and_request_id_echo(server: str) -> None:
    x = np.ones((1, 256), dtype=np.float32)
    doc = {
        "id": "nested-1",
        "inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": x.tolist()}],
    }
    r = post_json(server, "/v2/models/linear/versions/1/infer", doc)
    body = r.json()
    assert r.status_code == 200
    assert list(body)[:3] == ["id", "model_name", "model_version"]
    assert body["id"] == "nested-1" and body["model_version"] == "1"
    no_id = post_json(server, "/v2/models/linear/infer", linear_doc()).json()
    assert "id" not in no_id


def test_binary_data_output_parameter_makes_every_output_binary(server: str) -> None:
    doc = linear_doc(1, parameters={"binary_data_output": True})
    r = post_json(server, "/v2/models/linear/infer", doc)
    assert r.headers["content-type"] == "application/octet-stream"
    assert int(r.headers["content-length"]) == len(r.content)


def test_bytes_tensors_round_trip_in_json_and_binary(server: str) -> None:
    client = httpclient.InferenceServerClient(server)
    text = np.array([[b"hello"], [b"carbon"]], dtype=object)
    for binary in (False, True):
        inp = httpclient.InferInput("text", [2, 1], "BYTES")
        inp.set_data_from_numpy(text, binary_data=binary)
        outs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("upper", "length")]
        result = client.infer("echo_bytes", [inp], outputs=outs, headers=dict(AUTH))
        upper = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("upper").ravel()]
        assert upper == ["HELLO", "CARBON"]  # tritonclient gives str for JSON, bytes for binary
        assert result.as_numpy("length").ravel().tolist() == [5, 6]
    client.close()


def test_onnx_digits_model_classifies_through_the_gateway(server: str) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.data[:40].astype(np.float32)
    client = httpclient.InferenceServerClient(server)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("digits", [inp], headers=dict(AUTH))
    labels = result.as_numpy("label").ravel()
    assert result.as_numpy("probabilities").shape == (40, 10)
    assert (labels == digits.target[:40]).mean() >= 0.9
    client.close()


def test_concurrent_aio_requests_are_batched_and_each_gets_its_own_rows(server: str) -> None:
    async def run() -> None:
        client = aioclient.InferenceServerClient(server)
        rng = np.random.default_rng(11)
        xs = [rng.standard_normal((1, 256), dtype=np.float32) for _ in range(48)]

        async def one(x: np.ndarray) -> np.ndarray:
            inp = aioclient.InferInput("x", [1, 256], "FP32")
            inp.set_data_from_numpy(x)
            res = await client.infer("linear", [inp], headers=dict(AUTH))
            return res.as_numpy("y")

        ys = await asyncio.gather(*(one(x) for x in xs))
        for x, y in zip(xs, ys, strict=True):
            np.testing.assert_allclose(y, linear_reference(x), rtol=1e-5, atol=1e-5)
        await client.close()

    before = requests.get(url(server, "/v2/models/linear/stats"), headers=AUTH, timeout=5).json()[
        "model_stats"
    ][0]
    asyncio.run(run())
    after = requests.get(url(server, "/v2/models/linear/stats"), headers=AUTH, timeout=5).json()[
        "model_stats"
    ][0]
    rows = after["inference_count"] - before["inference_count"]
    batches = after["execution_count"] - before["execution_count"]
    assert rows == 48
    assert batches < 48  # requests shared batches
    assert any(b["batch_size"] > 1 for b in after["batch_stats"])


def test_stats_follow_tritons_format(server: str) -> None:
    assert_still_serving(server)
    client = httpclient.InferenceServerClient(server)
    stats = client.get_inference_statistics("linear", headers=AUTH)["model_stats"][0]
    assert stats["name"] == "linear" and stats["version"] == "1"
    assert stats["inference_stats"]["success"]["count"] >= 1
    assert {"batch_size", "compute_input", "compute_infer", "compute_output"} <= set(stats["batch_stats"][0])
    all_stats = requests.get(url(server, "/v2/models/stats"), headers=AUTH, timeout=5).json()
    assert {s["name"] for s in all_stats["model_stats"]} >= {"linear", "digits"}
    client.close()


def test_metrics_use_tritons_names_and_labels(server: str) -> None:
    assert_still_serving(server)
    text = requests.get(url(server, "/metrics"), timeout=5).text
    assert "# TYPE nv_inference_request_success counter" in text
    for metric in (
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_pending_request_count",
    ):
        assert f'{metric}{{model="linear",version="1"}}' in text
    assert 'nv_inference_request_failure{model="linear",version="1",reason="BACKEND"}' in text


# -- bad input: a clear error, and the server keeps serving -----------------------------------


def test_malformed_json_is_400(server: str) -> None:
    r = requests.post(url(server, "/v2/models/linear/infer"), data=b"{not json", headers=AUTH, timeout=5)
    assert r.status_code == 400
    assert "failed to parse the request JSON" in r.json()["error"]
    assert_still_serving(server)


def test_header_length_larger_than_body_is_400(server: str) -> None:
    r = requests.post(
        url(server, "/v2/models/linear/infer"),
        data=b'{"inputs":[]}',
        headers={**AUTH, "Inference-Header-Content-Length": "500"},
        timeout=5,
    )
    assert r.status_code == 400
    assert "Inference-Header-Content-Length is 500" in r.json()["error"]
    assert_still_serving(server)


def test_header_length_not_a_number_is_400(server: str) -> None:
    r = requests.post(
        url(server, "/v2/models/linear/infer"),
        data=b'{"inputs":[]}',
        headers={**AUTH, "Inference-Header-Content-Length": "twelve"},
        timeout=5,
    )
    assert r.status_code == 400
    assert "must be a non-negative integer" in r.json()["error"]
    assert_still_serving(server)


def test_unknown_model_and_version_are_404(server: str) -> None:
    r = post_json(server, "/v2/models/nosuch/infer", linear_doc())
    assert (r.status_code, r.json()) == (404, {"error": "Request for unknown model: 'nosuch' is not found"})
    r = post_json(server, "/v2/models/linear/versions/9/infer", linear_doc())
    assert r.status_code == 404 and "version 9" in r.json()["error"]
    assert requests.get(url(server, "/v2/models/nosuch"), headers=AUTH, timeout=5).status_code == 404
    assert_still_serving(server)


def test_wrong_datatype_is_400(server: str) -> None:
    doc = linear_doc()
    doc["inputs"][0]["datatype"] = "FP64"  # type: ignore[index]
    r = post_json(server, "/v2/models/linear/infer", doc)
    assert r.status_code == 400
    assert "data-type is 'FP64', but model 'linear' expects 'FP32'" in r.json()["error"]
    assert_still_serving(server)


def test_shape_not_matching_the_config_is_400(server: str) -> None:
    doc = {"inputs": [{"name": "x", "shape": [2, 255], "datatype": "FP32", "data": [0.0] * 510}]}
    r = post_json(server, "/v2/models/linear/infer", doc)
    assert r.status_code == 400
    assert (
        "unexpected shape for input 'x' for model 'linear'. Expected [-1,256], got [2,255]"
        in r.json()["error"]
    )
    assert_still_serving(server)


def test_data_length_not_matching_the_shape_is_400(server: str) -> None:
    doc = {"inputs": [{"name": "x", "shape": [1, 256], "datatype": "FP32", "data": [0.0] * 255}]}
    r = post_json(server, "/v2/models/linear/infer", doc)
    assert r.status_code == 400
    assert "needs 256 elements but 'data' has 255" in r.json()["error"]
    assert_still_serving(server)


def test_binary_size_not_matching_the_shape_is_400(server: str) -> None:
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [1, 256], "datatype": "FP32", "parameters": {"binary_data_size": 1020}}
            ]
        }
    ).encode()
    r = requests.post(
        url(server, "/v2/models/linear/infer"),
        data=header + b"\0" * 1020,
        headers={**AUTH, "Inference-Header-Content-Length": str(len(header))},
        timeout=5,
    )
    assert r.status_code == 400
    assert "needs 1024 bytes, binary_data_size is 1020" in r.json()["error"]
    assert_still_serving(server)


def test_batch_above_max_batch_size_is_400(server: str) -> None:
    r = post_json(server, "/v2/models/linear/infer", linear_doc(33))
    assert r.status_code == 400
    assert "batch-size must be <= 32 for 'linear'" in r.json()["error"]
    assert_still_serving(server)


def test_missing_and_unexpected_inputs_are_400(server: str) -> None:
    r = post_json(server, "/v2/models/linear/infer", {"inputs": []})
    assert r.status_code == 400 and "missing required input(s) ['x']" in r.json()["error"]
    doc = linear_doc()
    doc["inputs"].append({"name": "z", "shape": [1], "datatype": "FP32", "data": [1.0]})  # type: ignore[union-attr]
    r = post_json(server, "/v2/models/linear/infer", doc)
    assert r.status_code == 400 and "unexpected inference input 'z'" in r.json()["error"]
    assert_still_serving(server)


def test_body_above_the_limit_is_413(server: str) -> None:
    r = requests.post(
        url(server, "/v2/models/linear/infer"), data=b"x" * (MAX_BODY + 1), headers=AUTH, timeout=10
    )
    assert r.status_code == 413
    assert f"exceeds the limit of {MAX_BODY} bytes" in r.json()["error"]
    assert_still_serving(server)


def test_missing_invalid_and_read_only_keys(server: str) -> None:
    path = "/v2/models/linear/infer"
    r = requests.post(url(server, path), data=json.dumps(linear_doc()), timeout=5)
    assert r.status_code == 401 and "missing API key" in r.json()["error"]
    r = requests.post(
        url(server, path), data=json.dumps(linear_doc()), headers={"Authorization": "Bearer nope"}, timeout=5
    )
    assert r.status_code == 401 and "invalid or revoked" in r.json()["error"]
    r = requests.post(
        url(server, path), data=json.dumps(linear_doc()), headers={"Authorization": "Basic abc"}, timeout=5
    )
    assert r.status_code == 401 and "Bearer" in r.json()["error"]
    r = requests.post(
        url(server, path),
        data=json.dumps(linear_doc()),
        headers={"Authorization": f"Bearer {READ_KEY}"},
        timeout=5,
    )
    assert r.status_code == 403 and "'infer' scope" in r.json()["error"]
    assert_still_serving(server)


def test_backend_exception_fails_only_its_batch_with_500_naming_the_model(server: str) -> None:
    def infer(values: list[float]) -> requests.Response:
        doc = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": values}]}
        return post_json(server, "/v2/models/flaky/infer", doc)

    bad = infer([-1.0, 1.0])
    assert bad.status_code == 500
    assert "model 'flaky'" in bad.json()["error"] and "negative input" in bad.json()["error"]
    good = infer([1.0, 2.0])
    assert good.status_code == 200 and good.json()["outputs"][0]["data"] == [2.0, 4.0]
    metrics = requests.get(url(server, "/metrics"), timeout=5).text
    assert 'nv_inference_request_failure{model="flaky",version="1",reason="BACKEND"} 1' in metrics


def test_remote_triton_down_answers_503_within_a_bounded_time(server: str) -> None:
    t0 = time.monotonic()
    r = post_json(server, "/v2/models/remote_down/infer", linear_doc())
    elapsed = time.monotonic() - t0
    assert r.status_code == 503
    assert "remote Triton" in r.json()["error"] and "remote_down" in r.json()["error"]
    assert elapsed < 5.0
    assert_still_serving(server)


def slow_doc(seconds: float, **params: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [seconds]}]
    }
    if params:
        doc["parameters"] = params
    return doc


def test_full_queue_answers_429_with_retry_after_and_loses_nothing_accepted(server: str) -> None:
    results: dict[str, requests.Response] = {}

    def send(tag: str, seconds: float) -> None:
        results[tag] = post_json(server, "/v2/models/slow/infer", slow_doc(seconds))

    busy = threading.Thread(target=send, args=("busy", 0.6))
    busy.start()
    time.sleep(0.2)  # "busy" is executing
    queued = threading.Thread(target=send, args=("queued", 0.01))
    queued.start()
    time.sleep(0.2)  # "queued" fills the queue of size 1
    rejected = post_json(server, "/v2/models/slow/infer", slow_doc(0.01))
    busy.join()
    queued.join()
    assert rejected.status_code == 429
    assert int(rejected.headers["retry-after"]) >= 1
    assert "maximum queue size" in rejected.json()["error"]
    assert results["busy"].status_code == 200 and results["queued"].status_code == 200


def test_queue_timeout_from_the_client_rejects_promptly_while_the_instance_is_busy(server: str) -> None:
    results: dict[str, requests.Response] = {}
    busy = threading.Thread(
        target=lambda: results.setdefault("busy", post_json(server, "/v2/models/slow/infer", slow_doc(0.8)))
    )
    busy.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    r = post_json(server, "/v2/models/slow/infer", slow_doc(0.01, timeout=50_000))
    elapsed = time.monotonic() - t0
    busy.join()
    assert r.status_code == 503
    assert "Request timeout expired" in r.json()["error"]
    assert elapsed < 0.5  # the instance stayed busy for 0.6 s more
    assert results["busy"].status_code == 200


def test_bad_schedule_parameters_are_400(server: str) -> None:
    r = post_json(server, "/v2/models/linear/infer", linear_doc(parameters={"timeout": "soon"}))
    assert r.status_code == 400 and "'timeout' must be a non-negative integer" in r.json()["error"]


def test_get_on_infer_is_405_and_unknown_routes_404(server: str) -> None:
    assert requests.get(url(server, "/v2/models/linear/infer"), headers=AUTH, timeout=5).status_code == 405
    assert requests.get(url(server, "/v2/models/linear/bogus"), headers=AUTH, timeout=5).status_code == 404


def test_metrics_show_the_energy_efficiency_knob_and_what_its_planner_decided(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("eco-models")
    shutil.copytree(DEMO / "linear", root / "linear")
    config = root / "linear" / "config.pbtxt"
    config.write_text(
        config.read_text()
        + 'parameters { key: "energy_efficiency" value { string_value: "1" } }\n'
        + 'parameters { key: "latency_slo_ms" value { string_value: "50" } }\n'
    )
    gateway = Gateway(root, GatewayOptions(), static_resolver)
    with serve_asgi(gateway) as address:
        batcher = gateway.repository.version("linear", None).batcher
        planner = batcher.planner if batcher is not None else None
        assert planner is not None and planner.latency_source == "batch"
        for _ in range(4):
            assert post_json(address, "/v2/models/linear/infer", linear_doc()).status_code == 200
        text = requests.get(url(address, "/metrics"), timeout=5).text
    # The objective is judged on when answers left the server, not on when their batch ended.
    assert planner.latency_source == "response"
    labels = 'model="linear",version="1"'
    assert f"carbonledger_energy_efficiency{{{labels}}} 1" in text
    assert f"carbonledger_latency_slo_seconds{{{labels}}} 0.05" in text
    assert f"carbonledger_batch_target_rows{{{labels}}} " in text
    assert "# TYPE carbonledger_arrival_rows_per_second gauge" in text
    assert f'carbonledger_batch_planner_state{{{labels},state="learning"}} 1' in text
    p99 = next(line for line in text.splitlines() if line.startswith("carbonledger_latency_p99_seconds"))
    assert float(p99.rsplit(" ", 1)[1]) > 0
    late = next(line for line in text.splitlines() if line.startswith("carbonledger_latency_late_share"))
    assert 0.0 <= float(late.rsplit(" ", 1)[1]) <= 1.0


def test_with_freeze_heap_after_start_the_loaded_gateway_is_out_of_the_collector_s_reach(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("frozen-models")
    shutil.copytree(DEMO / "linear", root / "linear")
    gc.unfreeze()
    try:
        gateway = Gateway(root, GatewayOptions(freeze_heap_after_start=True), static_resolver)
        with serve_asgi(gateway) as address:
            # The model, its batcher and everything imported so far were alive at start-up: frozen.
            assert gc.get_freeze_count() > 0
            assert post_json(address, "/v2/models/linear/infer", linear_doc()).status_code == 200
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual
