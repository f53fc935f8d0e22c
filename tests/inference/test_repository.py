"""ModelRepository in inference/repository.py: Triton's layout, version policy, broken models.

Every repository here is built in tmp_path (python-backend models written at test time, the
demo ``digits`` ONNX model copied in). No Django, no database. Each repository is stopped by the
fixture so that its batcher threads end.
"""

from __future__ import annotations

import shutil
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.batcher import Pending
from inference.config import parse_config_text
from inference.efficiency import EfficiencySettings
from inference.errors import BackendError, InferenceError, ModelNotReady, NotFound
from inference.limits import MODEL_NAME_MAX_LENGTH, MODEL_VERSION_MAX_LENGTH
from inference.repository import GatewayOptions, ModelRepository, ModelVersion, select_versions

DEMO = Path(__file__).resolve().parents[2] / "inference" / "demo_repository"
WAIT_S = 10.0

# ---------------------------------------------------------------------------------------------
# model files

DOUBLE_PY = """
import numpy as np


class Model:
    def initialize(self, args):
        self.version = int(args["model_version"])

    def execute(self, inputs):
        x = inputs["x"]
        return {"y": (x * 2 + self.version * 1000).astype(np.float32)}
"""

INIT_RAISES_PY = """
class Model:
    def initialize(self, args):
        raise RuntimeError("no accelerator here")

    def execute(self, inputs):
        return {}
"""

BOOM_PY = """
import numpy as np


class Model:
    def execute(self, inputs):
        x = inputs["x"]
        if (x < 0).any():
            raise RuntimeError("negative input")
        return {"y": x.astype(np.float32)}
"""

ARGS_CHECK_PY = """
import numpy as np


class Model:
    def initialize(self, args):
        assert args["model_name"] == "checked", args
        assert args["model_version"] == "4", args
        assert args["model_config"]["max_batch_size"] == 8, args
        assert args["model_dir"].endswith("checked"), args
        assert args["instance_index"] == 0, args

    def execute(self, inputs):
        return {"y": inputs["x"]}
"""

SHRINK_PY = """
class Model:
    def execute(self, inputs):
        return {"y": inputs["x"][:-1]}
"""

NO_OUTPUT_PY = """
class Model:
    def execute(self, inputs):
        return {"z": inputs["x"]}
"""

# Instance 1 of 2 fails to initialize; every instance that did initialize records its finalize.
SECOND_INSTANCE_FAILS_PY = """
from pathlib import Path


class Model:
    def initialize(self, args):
        self.index = args["instance_index"]
        self.log = Path(args["model_dir"]) / "finalized.txt"
        if self.index == 1:
            raise RuntimeError("instance 1 cannot start")

    def execute(self, inputs):
        return {"y": inputs["x"]}

    def finalize(self):
        with self.log.open("a") as f:
            f.write(f"{self.index}\\n")
"""


def _config(name: str, extra: str = "", max_batch_size: int = 8) -> str:
    return textwrap.dedent(
        f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "x", data_type: TYPE_FP32, dims: [ 2 ] }} ]
        output [ {{ name: "y", data_type: TYPE_FP32, dims: [ 2 ] }} ]
        """
    ) + textwrap.dedent(extra)


def write_model(
    root: Path,
    name: str,
    config: str | None = None,
    versions: dict[str, str | None] | None = None,
) -> Path:
    """Write ``root/name/config.pbtxt`` and one ``model.py`` per version (None: empty directory)."""
    model_dir = root / name
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(_config(name) if config is None else config, encoding="utf-8")
    for version, source in (versions or {"1": DOUBLE_PY}).items():
        vdir = model_dir / version
        vdir.mkdir(exist_ok=True)
        if source is not None:
            (vdir / "model.py").write_text(source, encoding="utf-8")
    return model_dir


# ---------------------------------------------------------------------------------------------
# serving through the batcher, as inference/gateway.py does


class Call:
    """What the gateway's InferCall gives the batcher: ``inputs`` and ``received_ns``."""

    def __init__(self, inputs: dict[str, np.ndarray[Any, Any]]) -> None:
        self.inputs = inputs
        self.received_ns = time.monotonic_ns()
        self.done = threading.Event()
        self.result: Any = None


def deliver(items: list[tuple[Pending, Any]]) -> None:
    for pending, result in items:
        call: Call = pending.payload
        call.result = result
        call.done.set()


def submit(mv: ModelVersion, x: np.ndarray[Any, Any], name: str = "x") -> Call:
    call = Call({name: x})
    assert mv.batcher is not None
    mv.batcher.enqueue(Pending(call, rows=x.shape[0] if mv.spec.max_batch_size > 0 else 1))
    return call


def result_of(call: Call) -> Any:
    assert call.done.wait(WAIT_S), "no result delivered"
    return call.result


def infer(mv: ModelVersion, x: np.ndarray[Any, Any], name: str = "x") -> Any:
    return result_of(submit(mv, x, name))


RepoFactory = Callable[..., ModelRepository]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def make_repo(root: Path) -> Iterator[RepoFactory]:
    repos: list[ModelRepository] = []

    def make(**options: Any) -> ModelRepository:
        repo = ModelRepository(root, GatewayOptions(**options), deliver)
        repos.append(repo)
        repo.load()
        return repo

    yield make
    for repo in repos:
        repo.stop()


def _x(rows: int, start: float = 0.0) -> np.ndarray[Any, Any]:
    return (np.arange(rows * 2, dtype=np.float32) + start).reshape(rows, 2)


# ---------------------------------------------------------------------------------------------
# version policy


def _versions(repo: ModelRepository, name: str) -> list[str]:
    return sorted(repo.entry(name).versions, key=int)


def test_default_version_policy_serves_only_the_latest(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "m", versions={"1": DOUBLE_PY, "2": DOUBLE_PY, "3": DOUBLE_PY})
    repo = make_repo()
    assert _versions(repo, "m") == ["3"]
    assert repo.version("m", None).version == "3"


def test_latest_n_selects_the_n_highest_versions(root: Path, make_repo: RepoFactory) -> None:
    write_model(
        root,
        "m",
        _config("m", "version_policy { latest { num_versions: 2 } }"),
        {"1": DOUBLE_PY, "2": DOUBLE_PY, "3": DOUBLE_PY},
    )
    repo = make_repo()
    assert _versions(repo, "m") == ["2", "3"]
    assert all(mv.ready for mv in repo.entry("m").versions.values())


def test_versions_are_ordered_as_numbers_not_text(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "m", versions={"2": DOUBLE_PY, "10": DOUBLE_PY})
    repo = make_repo()
    assert _versions(repo, "m") == ["10"]


def test_all_policy_selects_every_version(root: Path, make_repo: RepoFactory) -> None:
    write_model(
        root,
        "m",
        _config("m", "version_policy { all { } }"),
        {"1": DOUBLE_PY, "2": DOUBLE_PY, "3": DOUBLE_PY},
    )
    repo = make_repo()
    assert _versions(repo, "m") == ["1", "2", "3"]
    assert [r["version"] for r in repo.index()] == ["1", "2", "3"]


def test_specific_policy_selects_the_listed_versions(root: Path, make_repo: RepoFactory) -> None:
    write_model(
        root,
        "m",
        _config("m", "version_policy { specific { versions: [ 1, 3 ] } }"),
        {"1": DOUBLE_PY, "2": DOUBLE_PY, "3": DOUBLE_PY},
    )
    repo = make_repo()
    assert _versions(repo, "m") == ["1", "3"]
    with pytest.raises(NotFound):
        repo.version("m", "2")


def test_specific_policy_matching_no_directory_leaves_the_model_unavailable(
    root: Path, make_repo: RepoFactory
) -> None:
    write_model(root, "m", _config("m", "version_policy { specific { versions: [ 7 ] } }"), {"1": DOUBLE_PY})
    repo = make_repo()
    entry = repo.entry("m")
    assert entry.versions == {}
    assert "no version directory matches the version policy" in entry.reason
    assert repo.index() == [{"name": "m", "state": "UNAVAILABLE", "reason": entry.reason}]


def test_directories_that_are_not_versions_are_ignored(root: Path, make_repo: RepoFactory) -> None:
    model_dir = write_model(root, "m", _config("m", "version_policy { all { } }"), {"1": DOUBLE_PY})
    (model_dir / "notes").mkdir()
    (model_dir / "v2").mkdir()
    (model_dir / "5").write_text("a file, not a directory")
    repo = make_repo()
    assert _versions(repo, "m") == ["1"]


def test_hidden_directories_in_the_root_are_not_models(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "m")
    (root / ".cache").mkdir()
    repo = make_repo()
    assert list(repo.models) == ["m"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [9]),
        ("version_policy { latest { num_versions: 2 } }", [3, 9]),
        ("version_policy { latest { num_versions: 5 } }", [1, 3, 9]),
        ("version_policy { all { } }", [1, 3, 9]),
        ("version_policy { specific { versions: [ 3, 4 ] } }", [3]),
    ],
)
def test_select_versions(policy: str, expected: list[int], root: Path) -> None:
    spec = parse_config_text(_config("m", policy), root / "m" / "config.pbtxt", "m")
    assert select_versions(spec, [9, 1, 3]) == expected


def test_a_stray_unicode_digit_directory_does_not_stop_the_repository(
    root: Path, make_repo: RepoFactory
) -> None:
    model_dir = write_model(root, "m")
    (model_dir / "\u00b2").mkdir()
    write_model(root, "other")
    repo = make_repo()
    assert repo.version("other", None).ready


def test_a_model_name_longer_than_the_ledger_column_is_not_ready_naming_the_limit(
    root: Path, make_repo: RepoFactory
) -> None:
    # The ledger stores each request's model name; a longer one would be refused by PostgreSQL at every drain.
    long_name = "m" * (MODEL_NAME_MAX_LENGTH + 1)
    write_model(root, long_name)
    write_model(root, "other")
    repo = make_repo()
    entry = repo.entry(long_name)
    assert not entry.ready_versions
    assert f"at most {MODEL_NAME_MAX_LENGTH} characters" in entry.reason
    assert repo.version("other", None).ready


def test_a_version_number_longer_than_the_ledger_column_is_not_served(
    root: Path, make_repo: RepoFactory
) -> None:
    huge = "9" * (MODEL_VERSION_MAX_LENGTH + 1)
    write_model(
        root,
        "m",
        config=_config("m", "version_policy: { all { } }"),
        versions={"1": DOUBLE_PY, huge: DOUBLE_PY},
    )
    repo = make_repo()
    assert _versions(repo, "m") == ["1"]
    assert repo.version("m", None).ready


# ---------------------------------------------------------------------------------------------
# broken models are reported, the others serve


@pytest.fixture
def mixed_repo(root: Path, make_repo: RepoFactory) -> ModelRepository:
    write_model(root, "good")
    write_model(root, "badcfg", "this is { not a config")
    write_model(root, "initfail", versions={"1": INIT_RAISES_PY})
    write_model(root, "nofile", versions={"1": None})
    write_model(root, "misnamed", _config("other_name"))
    write_model(root, "nobackend", _config("nobackend").replace('backend: "python"', 'backend: "tensorrt"'))
    return make_repo()


def test_broken_config_is_not_ready_with_the_reason(mixed_repo: ModelRepository, root: Path) -> None:
    entry = mixed_repo.entry("badcfg")
    assert entry.spec is None
    assert entry.versions == {}
    assert entry.ready_versions == []
    assert entry.reason.startswith(f"{root / 'badcfg' / 'config.pbtxt'}: ")
    row = next(r for r in mixed_repo.index() if r["name"] == "badcfg")
    assert row == {"name": "badcfg", "state": "UNAVAILABLE", "reason": entry.reason}


def test_config_name_not_matching_the_directory_is_not_ready(mixed_repo: ModelRepository) -> None:
    entry = mixed_repo.entry("misnamed")
    assert entry.spec is None
    assert "name 'other_name' does not match the model directory 'misnamed'" in entry.reason


def test_model_whose_initialize_raises_is_not_ready_with_the_reason(mixed_repo: ModelRepository) -> None:
    mv = mixed_repo.entry("initfail").versions["1"]
    assert mv.ready is False
    assert mv.batcher is None
    assert mv.backends == []
    assert mv.reason == "failed to load: RuntimeError: no accelerator here"
    assert (
        mixed_repo.entry("initfail").reason == "version 1: failed to load: RuntimeError: no accelerator here"
    )
    row = next(r for r in mixed_repo.index() if r["name"] == "initfail")
    assert row == {"name": "initfail", "version": "1", "state": "UNAVAILABLE", "reason": mv.reason}


def test_model_with_a_missing_model_file_is_not_ready_with_the_reason(
    mixed_repo: ModelRepository, root: Path
) -> None:
    mv = mixed_repo.entry("nofile").versions["1"]
    assert mv.ready is False
    assert mv.reason == f"failed to load: FileNotFoundError: {root / 'nofile' / '1' / 'model.py'} is missing"
    assert mixed_repo.entry("nofile").reason == f"version 1: {mv.reason}"


def test_model_with_an_unsupported_backend_is_not_ready_with_the_reason(mixed_repo: ModelRepository) -> None:
    mv = mixed_repo.entry("nobackend").versions["1"]
    assert mv.ready is False
    assert "no backend for backend='tensorrt'" in mv.reason


def test_index_lists_every_model_sorted_with_its_state(mixed_repo: ModelRepository) -> None:
    rows = mixed_repo.index()
    assert [r["name"] for r in rows] == ["badcfg", "good", "initfail", "misnamed", "nobackend", "nofile"]
    states = {r["name"]: r["state"] for r in rows}
    assert states == {
        "badcfg": "UNAVAILABLE",
        "good": "READY",
        "initfail": "UNAVAILABLE",
        "misnamed": "UNAVAILABLE",
        "nobackend": "UNAVAILABLE",
        "nofile": "UNAVAILABLE",
    }
    good = next(r for r in rows if r["name"] == "good")
    assert good == {"name": "good", "version": "1", "state": "READY"}  # no reason when ready
    assert all(r["reason"] for r in rows if r["state"] == "UNAVAILABLE")


def test_good_model_beside_broken_ones_is_ready_and_serves(mixed_repo: ModelRepository) -> None:
    mv = mixed_repo.version("good", None)
    assert mv.ready is True
    assert mv.reason == ""
    out = infer(mv, _x(3))
    assert isinstance(out, dict)
    np.testing.assert_array_equal(out["y"], _x(3) * 2 + 1000)
    assert out["y"].dtype == np.float32


def test_model_with_no_ready_version_answers_not_found_with_the_reason(mixed_repo: ModelRepository) -> None:
    with pytest.raises(NotFound) as info:
        mixed_repo.version("initfail", None)
    assert info.value.status == 404
    assert info.value.message == (
        "Request for unknown model: 'initfail' has no available versions "
        "(version 1: failed to load: RuntimeError: no accelerator here)"
    )


def test_a_named_version_that_failed_is_not_ready(mixed_repo: ModelRepository) -> None:
    with pytest.raises(ModelNotReady) as info:
        mixed_repo.version("initfail", "1")
    assert info.value.status == 400
    assert "Model 'initfail' version 1 is not ready: failed to load: RuntimeError" in info.value.message


def test_metadata_of_a_ready_model_reads_like_triton(mixed_repo: ModelRepository) -> None:
    import orjson

    meta = orjson.loads(mixed_repo.entry("good").metadata_bytes)
    assert meta == {
        "name": "good",
        "versions": ["1"],
        "platform": "python",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
    }


# ---------------------------------------------------------------------------------------------
# version lookup


def test_version_none_picks_the_highest_ready_version(root: Path, make_repo: RepoFactory) -> None:
    write_model(
        root,
        "m",
        _config("m", "version_policy { all { } }"),
        {"1": DOUBLE_PY, "2": DOUBLE_PY, "3": INIT_RAISES_PY},
    )
    repo = make_repo()
    assert [mv.version for mv in repo.entry("m").ready_versions] == ["1", "2"]
    mv = repo.version("m", None)
    assert mv.version == "2"
    assert repo.version("m", "") is mv
    np.testing.assert_array_equal(infer(mv, _x(1))["y"], _x(1) * 2 + 2000)
    assert repo.version("m", "1").version == "1"
    with pytest.raises(ModelNotReady):
        repo.version("m", "3")
    assert repo.entry("m").reason == ""  # some version is ready


def test_unknown_model_is_not_found_with_tritons_text(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "m")
    repo = make_repo()
    for call in (lambda: repo.entry("x"), lambda: repo.version("x", None), lambda: repo.version("x", "1")):
        with pytest.raises(NotFound) as info:
            call()
        assert info.value.status == 404
        assert info.value.message == "Request for unknown model: 'x' is not found"


@pytest.mark.parametrize("version", ["2", "abc", "01"])
def test_unknown_version_is_not_found(root: Path, make_repo: RepoFactory, version: str) -> None:
    write_model(root, "m")
    repo = make_repo()
    with pytest.raises(NotFound) as info:
        repo.version("m", version)
    assert info.value.status == 404
    assert info.value.message == f"Request for unknown model: 'm' version {version} is not found"


def test_missing_repository_root_raises(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path / "nowhere", GatewayOptions(), deliver)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        repo.load()


def test_initialize_gets_name_version_config_dir_and_instance(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "checked", versions={"4": ARGS_CHECK_PY})
    repo = make_repo()
    mv = repo.entry("checked").versions["4"]
    assert mv.ready, mv.reason


# ---------------------------------------------------------------------------------------------
# the runner: batches in, per-request results out


def _pending(x: np.ndarray[Any, Any]) -> Pending:
    return Pending(Call({"x": x}), rows=x.shape[0])


def test_runner_splits_a_batch_back_to_each_request_by_rows(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "m")
    mv = make_repo().version("m", None)
    run = mv.runner(mv.backends[0])
    xs = [_x(1, 0), _x(3, 100), _x(2, 200)]
    results, timings = run([_pending(x) for x in xs])
    assert len(results) == 3
    for x, result in zip(xs, results, strict=True):
        assert list(result) == ["y"]
        np.testing.assert_array_equal(result["y"], x * 2 + 1000)
    assert len(timings) == 3
    assert all(t >= 0 for t in timings)


def test_runner_passes_a_single_request_through(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "m")
    mv = make_repo().version("m", None)
    results, _ = mv.runner(mv.backends[0])([_pending(_x(4))])
    assert len(results) == 1
    np.testing.assert_array_equal(results[0]["y"], _x(4) * 2 + 1000)


def test_runner_rejects_output_rows_not_matching_the_batch(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "shrink", versions={"1": SHRINK_PY})
    mv = make_repo().version("shrink", None)
    with pytest.raises(BackendError) as info:
        mv.runner(mv.backends[0])([_pending(_x(1)), _pending(_x(2))])
    assert info.value.status == 500
    assert "model 'shrink' version 1 returned output 'y' with 2 rows for a batch of 3" in info.value.message


def test_runner_rejects_a_missing_output(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "noout", versions={"1": NO_OUTPUT_PY})
    mv = make_repo().version("noout", None)
    with pytest.raises(BackendError, match="model 'noout' version 1 returned no output 'y'"):
        mv.runner(mv.backends[0])([_pending(_x(1))])


def test_requests_batched_together_get_their_own_rows(root: Path, make_repo: RepoFactory) -> None:
    # Preferred size 3 and a long delay: the two requests (1 + 2 rows) leave as one batch of 3.
    write_model(
        root,
        "m",
        _config(
            "m",
            """
            dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 5000000 }
            parameters { key: "adaptive_delay" value { string_value: "false" } }
            """,
        ),
    )
    mv = make_repo().version("m", None)
    a, b = _x(1, 0), _x(2, 50)
    ca = submit(mv, a)
    cb = submit(mv, b)
    ra, rb = result_of(ca), result_of(cb)
    np.testing.assert_array_equal(ra["y"], a * 2 + 1000)
    np.testing.assert_array_equal(rb["y"], b * 2 + 1000)
    stats = mv.stats.as_triton()
    assert stats["execution_count"] == 1
    assert stats["inference_count"] == 3
    assert [s["batch_size"] for s in stats["batch_stats"]] == [3]


# ---------------------------------------------------------------------------------------------
# backend failures fail one batch only


def test_backend_raising_fails_only_that_batch(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "boom", versions={"1": BOOM_PY})
    write_model(root, "good")
    repo = make_repo()
    mv = repo.version("boom", None)
    bad = infer(mv, -_x(2, 1))
    assert isinstance(bad, BackendError)
    assert isinstance(bad, InferenceError)
    assert bad.status == 500
    assert bad.reason == "BACKEND"
    assert bad.message == "model 'boom' version 1 failed: RuntimeError: negative input"
    # The same model serves the next batch, and the neighbour never noticed.
    np.testing.assert_array_equal(infer(mv, _x(2))["y"], _x(2))
    np.testing.assert_array_equal(infer(repo.version("good", None), _x(1))["y"], _x(1) * 2 + 1000)
    stats = mv.stats.as_triton()
    assert stats["inference_stats"]["fail"]["count"] == 1
    assert stats["inference_stats"]["success"]["count"] == 1
    assert stats["execution_count"] == 1
    assert mv.stats.failures["BACKEND"] == 1


# ---------------------------------------------------------------------------------------------
# stats


def test_stats_record_an_executed_batch(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "m")
    mv = make_repo().version("m", None)
    before = mv.stats.as_triton()
    assert before["execution_count"] == 0
    assert before["batch_stats"] == []
    infer(mv, _x(4))
    stats = mv.stats.as_triton()
    assert stats["name"] == "m"
    assert stats["version"] == "1"
    assert stats["execution_count"] == 1
    assert stats["inference_count"] == 4
    assert stats["last_inference"] > 0
    inf = stats["inference_stats"]
    assert inf["success"]["count"] == 1
    assert inf["queue"]["count"] == 1
    assert inf["compute_infer"]["count"] == 1
    assert inf["compute_infer"]["ns"] > 0
    assert inf["fail"] == {"count": 0, "ns": 0}
    assert len(stats["batch_stats"]) == 1
    entry = stats["batch_stats"][0]
    assert entry["batch_size"] == 4
    assert entry["compute_infer"]["count"] == 1
    assert entry["compute_input"]["count"] == 1
    assert entry["compute_output"]["count"] == 1


def test_stats_keep_one_entry_per_batch_size(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "m")
    mv = make_repo().version("m", None)
    for rows in (2, 1, 2):
        infer(mv, _x(rows))
    stats = mv.stats.as_triton()
    assert stats["execution_count"] == 3
    assert stats["inference_count"] == 5
    assert [(s["batch_size"], s["compute_infer"]["count"]) for s in stats["batch_stats"]] == [(1, 1), (2, 2)]


# ---------------------------------------------------------------------------------------------
# onnxruntime backend


def _copy_digits(root: Path) -> Path:
    return Path(shutil.copytree(DEMO / "digits", root / "digits"))


def test_onnx_model_loads_and_answers(root: Path, make_repo: RepoFactory) -> None:
    pytest.importorskip("onnxruntime")
    _copy_digits(root)
    repo = make_repo()
    mv = repo.version("digits", None)
    assert mv.ready, mv.reason
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 16, size=(3, 64)).astype(np.float32)
    out = infer(mv, x, "input")
    assert isinstance(out, dict), out
    probs, label = out["probabilities"], out["label"]
    assert probs.shape == (3, 10)
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert label.shape == (3, 1)
    assert label.dtype == np.int64
    np.testing.assert_array_equal(label[:, 0], probs.argmax(axis=1))
    assert mv.stats.as_triton()["inference_count"] == 3


def test_onnx_model_without_its_file_is_not_ready(root: Path, make_repo: RepoFactory) -> None:
    pytest.importorskip("onnxruntime")
    model_dir = _copy_digits(root)
    (model_dir / "1" / "model.onnx").unlink()
    repo = make_repo()
    mv = repo.entry("digits").versions["1"]
    assert mv.ready is False
    assert mv.reason == f"failed to load: FileNotFoundError: {model_dir / '1' / 'model.onnx'} is missing"


def test_onnx_model_whose_config_does_not_match_the_graph_is_not_ready(
    root: Path, make_repo: RepoFactory
) -> None:
    pytest.importorskip("onnxruntime")
    model_dir = _copy_digits(root)
    cfg = model_dir / "config.pbtxt"
    cfg.write_text(
        cfg.read_text(encoding="utf-8").replace('name: "input"', 'name: "pixels"'), encoding="utf-8"
    )
    mv = make_repo().entry("digits").versions["1"]
    assert mv.ready is False
    assert "config inputs ['pixels'] but the ONNX graph has ['input']" in mv.reason


# ---------------------------------------------------------------------------------------------
# lifecycle and known bugs


def test_stop_calls_finalize_of_every_instance(root: Path) -> None:
    source = SECOND_INSTANCE_FAILS_PY.replace("if self.index == 1:", "if False:")
    model_dir = write_model(
        root, "m", _config("m", "instance_group [ { count: 2, kind: KIND_CPU } ]"), {"1": source}
    )
    repo = ModelRepository(root, GatewayOptions(), deliver)
    try:
        repo.load()
        assert len(repo.version("m", None).backends) == 2
    finally:
        repo.stop()
    assert sorted((model_dir / "finalized.txt").read_text().split()) == ["0", "1"]


def test_instances_created_before_a_failing_one_are_closed(root: Path, make_repo: RepoFactory) -> None:
    model_dir = write_model(
        root,
        "m",
        _config("m", "instance_group [ { count: 2, kind: KIND_CPU } ]"),
        {"1": SECOND_INSTANCE_FAILS_PY},
    )
    repo = make_repo()
    mv = repo.entry("m").versions["1"]
    assert mv.ready is False
    assert "instance 1 cannot start" in mv.reason
    log = model_dir / "finalized.txt"
    assert log.is_file() and log.read_text().split() == ["0"]


PRIORITY_QUEUE_POLICY = """
dynamic_batching {
  priority_levels: 2
  default_priority_level: 2
  priority_queue_policy { key: 1 value { max_queue_size: 4 } }
}
"""


def test_model_with_priority_queue_policy_loads_beside_others(root: Path, make_repo: RepoFactory) -> None:
    write_model(root, "prio", _config("prio", PRIORITY_QUEUE_POLICY))
    write_model(root, "good")
    repo = make_repo()
    assert repo.version("good", None).ready
    mv = repo.version("prio", None)
    np.testing.assert_array_equal(infer(mv, _x(1))["y"], _x(1) * 2 + 1000)


# ---------------------------------------------------------------------------------------------
# the energy-efficiency knob


def test_a_model_with_the_knob_gets_a_planner_that_learns_from_its_batches(
    root: Path, make_repo: RepoFactory
) -> None:
    write_model(
        root,
        "eco",
        _config(
            "eco",
            """
            dynamic_batching { max_queue_delay_microseconds: 100 }
            parameters { key: "energy_efficiency" value { string_value: "0.5" } }
            parameters { key: "latency_slo_ms" value { string_value: "40" } }
            """,
        ),
    )
    write_model(root, "plain", _config("plain", "dynamic_batching { max_queue_delay_microseconds: 100 }"))
    repo = make_repo()
    eco, plain = repo.version("eco", None), repo.version("plain", None)
    assert eco.batcher is not None and plain.batcher is not None
    assert plain.batcher.planner is None  # the knob at 0: Triton's batcher, untouched
    planner = eco.batcher.planner
    assert planner is not None
    assert planner.settings == EfficiencySettings(0.5, 40_000_000)
    for i in range(5):
        np.testing.assert_array_equal(infer(eco, _x(1, i))["y"], _x(1, i) * 2 + 1000)
    assert planner.time_fit.count == 5
    assert planner.p99_ns() is not None and planner.rate_rows_per_s > 0


def test_a_bad_knob_keeps_that_model_unloaded_with_the_reason(root: Path, make_repo: RepoFactory) -> None:
    write_model(
        root,
        "eco",
        _config(
            "eco",
            """
            dynamic_batching { max_queue_delay_microseconds: 100 }
            parameters { key: "energy_efficiency" value { string_value: "0.5" } }
            """,
        ),
    )
    write_model(root, "good")
    repo = make_repo()
    assert repo.version("good", None).ready
    entry = repo.entry("eco")
    assert entry.ready_versions == []
    assert "model 'eco': energy_efficiency above 0 needs a latency objective (latency_slo_ms)" in entry.reason
