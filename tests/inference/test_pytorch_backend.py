"""The PyTorch backend on the CPU, where PyTorch is installed (requirements-torch.txt); skipped elsewhere.

TorchScript and torch.export models written at test time are loaded through the model repository and served
through the batcher, as the gateway does; KIND_GPU models are refused here because this host has no CUDA.
"""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is optional (requirements-torch.txt); the pytorch backend's tests need it"
)

from inference.backends.pytorch import PyTorchBackend  # noqa: E402
from inference.batcher import Pending  # noqa: E402
from inference.config import load_config  # noqa: E402
from inference.kserve import DTYPES  # noqa: E402
from inference.repository import GatewayOptions, ModelRepository, ModelVersion  # noqa: E402

WAIT_S = 10.0
# PyTorch 2.13 marks TorchScript deprecated; it is still Triton's pytorch_libtorch format.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.:DeprecationWarning")


class Affine(torch.nn.Module):
    """y = x @ W + b, and the arg-max of y as an int64 label: two outputs of different datatypes."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 3, generator=gen))
        self.b = torch.nn.Parameter(torch.randn(3, generator=gen))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x @ self.w + self.b
        return y, y.argmax(dim=1, keepdim=True)


class AsDict(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"label": x.sum(dim=1, keepdim=True).long(), "y": x[:, :3] * 2}


def reference(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    module = Affine()
    return (
        x.astype(np.float64) @ module.w.detach().double().numpy() + module.b.detach().double().numpy()
    ).astype(np.float32)


def config(name: str, extra: str = "", filename: str = "") -> str:
    head = f'default_model_filename: "{filename}"\n' if filename else ""
    return (
        textwrap.dedent(
            f"""
            name: "{name}"
            platform: "pytorch_libtorch"
            max_batch_size: 16
            input [ {{ name: "x", data_type: TYPE_FP32, dims: [ 4 ] }} ]
            output [
              {{ name: "y", data_type: TYPE_FP32, dims: [ 3 ] }},
              {{ name: "label", data_type: TYPE_INT64, dims: [ 1 ] }}
            ]
            dynamic_batching {{ max_queue_delay_microseconds: 100 }}
            """
        )
        + head
        + textwrap.dedent(extra)
    )


def write_scripted(root: Path, name: str, extra: str = "", module: torch.nn.Module | None = None) -> Path:
    model_dir = root / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config(name, extra))
    torch.jit.save(
        torch.jit.script(module if module is not None else Affine()), str(model_dir / "1" / "model.pt")
    )
    return model_dir


class Call:
    def __init__(self, x: np.ndarray[Any, Any]) -> None:
        self.inputs = {"x": x}
        self.received_ns = time.monotonic_ns()
        self.done = threading.Event()
        self.result: Any = None


def deliver(items: list[tuple[Pending, Any]]) -> None:
    for pending, result in items:
        pending.payload.result = result
        pending.payload.done.set()


def infer(mv: ModelVersion, x: np.ndarray[Any, Any]) -> Any:
    call = Call(x)
    assert mv.batcher is not None
    mv.batcher.enqueue(Pending(call, rows=x.shape[0]))
    assert call.done.wait(WAIT_S), "no result delivered"
    return call.result


RepoFactory = Callable[[], ModelRepository]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def make_repo(root: Path) -> Iterator[RepoFactory]:
    repos: list[ModelRepository] = []

    def make() -> ModelRepository:
        repo = ModelRepository(root, GatewayOptions(), deliver)
        repos.append(repo)
        repo.load()
        return repo

    yield make
    for repo in repos:
        repo.stop()


def x_rows(rows: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return np.random.default_rng(seed).standard_normal((rows, 4)).astype(np.float32)


def test_a_torchscript_model_on_a_cpu_instance_serves_its_outputs_in_the_configs_datatypes(
    root: Path, make_repo: RepoFactory
) -> None:
    write_scripted(root, "affine", "instance_group [ { count: 2, kind: KIND_CPU } ]")
    mv = make_repo().version("affine", None)
    assert mv.ready, mv.reason
    assert len(mv.backends) == 2
    x = x_rows(5)
    out = infer(mv, x)
    assert out["y"].dtype == np.float32 and out["y"].shape == (5, 3)
    np.testing.assert_allclose(out["y"], reference(x), rtol=1e-5, atol=1e-5)
    assert out["label"].dtype == np.int64
    np.testing.assert_array_equal(out["label"][:, 0], reference(x).argmax(axis=1))


def test_a_batch_of_several_requests_is_split_back_by_rows(root: Path, make_repo: RepoFactory) -> None:
    write_scripted(root, "affine")
    mv = make_repo().version("affine", None)
    xs = [x_rows(1, 1), x_rows(3, 2), x_rows(2, 3)]
    results, _ = mv.runner(mv.backends[0])([Pending(Call(x), rows=x.shape[0]) for x in xs])
    for x, result in zip(xs, results, strict=True):
        np.testing.assert_allclose(result["y"], reference(x), rtol=1e-5, atol=1e-5)


def test_a_read_only_input_is_served_and_left_as_it_was(root: Path, make_repo: RepoFactory) -> None:
    write_scripted(root, "affine")
    mv = make_repo().version("affine", None)
    x = x_rows(2)
    frozen = np.frombuffer(x.tobytes(), dtype=np.float32).reshape(2, 4)  # as the codec decodes in place
    assert not frozen.flags.writeable
    np.testing.assert_allclose(infer(mv, frozen)["y"], reference(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("precision", "dtype", "tolerance"), [("fp16", "float16", 1e-2), ("bf16", "bfloat16", 6e-2)]
)
def test_half_precision_runs_the_weights_in_it_and_answers_in_fp32(
    root: Path, make_repo: RepoFactory, precision: str, dtype: str, tolerance: float
) -> None:
    write_scripted(root, "half", f'parameters {{ key: "precision" value {{ string_value: "{precision}" }} }}')
    mv = make_repo().version("half", None)
    assert mv.ready, mv.reason
    backend = mv.backends[0]
    assert isinstance(backend, PyTorchBackend)
    assert {p.dtype for p in backend._module.parameters()} == {getattr(torch, dtype)}
    x = x_rows(8)
    y = infer(mv, x)["y"]
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, reference(x), rtol=tolerance, atol=tolerance * 4)
    assert not np.array_equal(y, reference(x))  # computed in half precision, not in fp32


def test_a_module_returning_a_dict_is_read_by_output_name(root: Path, make_repo: RepoFactory) -> None:
    write_scripted(root, "named", module=AsDict())
    mv = make_repo().version("named", None)
    assert mv.ready, mv.reason
    x = x_rows(3)
    out = infer(mv, x)
    np.testing.assert_allclose(out["y"], x[:, :3] * 2)
    np.testing.assert_array_equal(out["label"], x.sum(axis=1, keepdims=True).astype(np.int64))


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_bf16_tensors_cross_as_ml_dtypes_bfloat16_both_ways(root: Path, make_repo: RepoFactory) -> None:
    model_dir = root / "bf16"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(
        textwrap.dedent(
            """
            name: "bf16"
            platform: "pytorch_libtorch"
            max_batch_size: 4
            input [ { name: "x", data_type: TYPE_BF16, dims: [ 3 ] } ]
            output [ { name: "y", data_type: TYPE_BF16, dims: [ 3 ] } ]
            """
        )
    )
    torch.jit.save(torch.jit.script(Double()), str(model_dir / "1" / "model.pt"))
    mv = make_repo().version("bf16", None)
    assert mv.ready, mv.reason
    x = np.array([[1.5, -2.0, 0.25]], dtype=DTYPES["BF16"])
    y = infer(mv, x)["y"]
    assert y.dtype == DTYPES["BF16"]
    np.testing.assert_array_equal(y.astype(np.float32), [[3.0, -4.0, 0.5]])


def test_a_torch_export_program_with_a_dynamic_batch_serves(root: Path, make_repo: RepoFactory) -> None:
    model_dir = root / "exported"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(config("exported", filename="model.pt2"))
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(Affine().eval(), (torch.zeros(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(model_dir / "1" / "model.pt2"))
    mv = make_repo().version("exported", None)
    assert mv.ready, mv.reason
    for rows in (1, 7):
        x = x_rows(rows, rows)
        np.testing.assert_allclose(infer(mv, x)["y"], reference(x), rtol=1e-5, atol=1e-5)


def test_a_module_whose_outputs_do_not_match_the_config_is_not_ready_with_the_reason(
    root: Path, make_repo: RepoFactory
) -> None:
    class OneOutput(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    model_dir = write_scripted(root, "short", module=OneOutput())
    mv = make_repo().entry("short").versions["1"]
    assert mv.ready is False
    assert mv.reason == (
        f"failed to load: ValueError: {model_dir / '1' / 'model.pt'}: a one-row dry run failed: ValueError: "
        "the module returned 1 tensor(s) for the config's outputs ['y', 'label']"
    )


def test_a_bad_precision_is_not_ready_with_the_reason(root: Path, make_repo: RepoFactory) -> None:
    write_scripted(root, "odd", 'parameters { key: "precision" value { string_value: "fp8" } }')
    mv = make_repo().entry("odd").versions["1"]
    assert mv.ready is False
    assert "parameter 'precision' must be one of fp32, fp16, bf16, got 'fp8'" in mv.reason


def test_a_gpu_model_without_cuda_is_not_ready_with_the_reason_and_the_cpu_model_beside_it_serves(
    root: Path, make_repo: RepoFactory
) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the refusal is for hosts without it")
    write_scripted(root, "on_gpu", "instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]")
    write_scripted(root, "on_cpu")
    repo = make_repo()
    gpu = repo.entry("on_gpu").versions["1"]
    assert gpu.ready is False
    assert gpu.reason == (
        "failed to load: RuntimeMissing: model 'on_gpu' instance 0 is KIND_GPU on GPU 0, but PyTorch "
        f"{torch.__version__} sees no CUDA device (built for CUDA {torch.version.cuda or 'none: a CPU-only build'}); "
        "it is not run on the CPU instead"
    )
    x = x_rows(2)
    np.testing.assert_allclose(
        infer(repo.version("on_cpu", None), x)["y"], reference(x), rtol=1e-5, atol=1e-5
    )


def test_the_config_the_backend_reads_is_the_repositorys(root: Path) -> None:
    # KIND_AUTO runs on the CPU: the recorder meters a model without a KIND_GPU group on the CPU.
    model_dir = write_scripted(root, "auto", "instance_group [ { count: 1, kind: KIND_AUTO } ]")
    spec = load_config(model_dir)
    backend = PyTorchBackend(spec, "1", model_dir / "1", 0, GatewayOptions())
    try:
        assert str(backend._device) == "cpu"
    finally:
        backend.close()
