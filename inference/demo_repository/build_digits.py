"""Build the ``digits`` demo models for the Triton-compatible model repository.

Trains a small MLP on scikit-learn's bundled digits dataset (8x8 images, pixel values 0..16),
exports it to ONNX (FP32) with skl2onnx, derives a statically INT8-quantized variant with
``onnxruntime.quantization`` (calibrated on the training split), measures the held-out test
accuracy of both ONNX files in onnxruntime, and writes them in Triton's repository layout::

    <out>/digits/config.pbtxt          <out>/digits_int8/config.pbtxt
    <out>/digits/1/model.onnx          <out>/digits_int8/1/model.onnx
    <out>/digits/accuracy.json         <out>/digits_int8/accuracy.json

Usage: ``python build_digits.py [OUT_DIR]`` (default: the directory containing this script).
Everything is seeded, so re-running on the same library versions reproduces the same files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import sklearn
from google.protobuf import text_format
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler
from tritonclient.grpc import model_config_pb2

MODEL_NAME = "digits"
INT8_NAME = "digits_int8"
SPLIT_SEED = 42
TRAIN_SEED = 0
TEST_SIZE = 0.25
N_FEATURES = 64
N_CLASSES = 10
MAX_BATCH_SIZE = 64
CALIBRATION_BATCH = 64
INPUT_NAME = "input"
PROBA_NAME = "probabilities"
LABEL_NAME = "label"
ONNX_OPSET = 17
ONNX_ML_OPSET = 3
IR_VERSION = 8  # keeps the files loadable by older onnxruntime builds shipped in Triton images


@dataclass(frozen=True)
class Split:
    x_train: NDArray[np.float32]
    x_test: NDArray[np.float32]
    y_train: NDArray[np.int64]
    y_test: NDArray[np.int64]


def load_split() -> Split:
    """The stratified 75/25 train/test split of ``load_digits`` used for training and evaluation."""
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32),
        y.astype(np.int64),
        test_size=TEST_SIZE,
        stratify=y,
        random_state=SPLIT_SEED,
    )
    return Split(x_train=x_train, x_test=x_test, y_train=y_train, y_test=y_test)


def dataset_description(n_test: int) -> str:
    return f"sklearn digits, held-out {round(TEST_SIZE * 100)} %, n={n_test}"


def train(split: Split) -> Pipeline:
    model = Pipeline(
        [
            ("scale", StandardScaler()),
            (
                "mlp",
                MLPClassifier(
                    hidden_layer_sizes=(64,),
                    alpha=1e-3,
                    max_iter=400,
                    random_state=TRAIN_SEED,
                ),
            ),
        ]
    )
    model.fit(split.x_train, split.y_train)
    return model


def to_onnx(model: Pipeline) -> onnx.ModelProto:
    """Convert to ONNX with exactly the tensors promised by config.pbtxt.

    input ``input`` float32 [N, 64]; outputs ``probabilities`` float32 [N, 10] and
    ``label`` int64 [N, 1] (skl2onnx emits a 1-D label, so it is reshaped here).
    """
    mlp = model.named_steps["mlp"]
    onx: onnx.ModelProto = convert_sklearn(
        model,
        name=MODEL_NAME,
        initial_types=[(INPUT_NAME, FloatTensorType([None, N_FEATURES]))],
        options={id(mlp): {"zipmap": False}},
        target_opset={"": ONNX_OPSET, "ai.onnx.ml": ONNX_ML_OPSET},
    )
    graph = onx.graph
    outputs = {o.name: o for o in graph.output}
    if set(outputs) != {LABEL_NAME, PROBA_NAME}:
        raise RuntimeError(f"unexpected skl2onnx outputs: {sorted(outputs)}")

    flat_label = "label_flat"
    for node in graph.node:
        node.output[:] = [flat_label if name == LABEL_NAME else name for name in node.output]
    shape_name = "label_shape"
    graph.initializer.append(numpy_helper.from_array(np.array([-1, 1], dtype=np.int64), shape_name))
    graph.node.append(
        helper.make_node("Reshape", [flat_label, shape_name], [LABEL_NAME], name="label_to_column")
    )

    batch = "batch"
    del graph.output[:]
    graph.output.extend(
        [
            helper.make_tensor_value_info(PROBA_NAME, TensorProto.FLOAT, [batch, N_CLASSES]),
            helper.make_tensor_value_info(LABEL_NAME, TensorProto.INT64, [batch, 1]),
        ]
    )
    del graph.input[:]
    graph.input.append(helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [batch, N_FEATURES]))
    onx.ir_version = IR_VERSION
    onx.doc_string = "MLP(64) digits classifier, FP32"
    onnx.checker.check_model(onx, full_check=True)
    return onx


class TrainingSetReader(CalibrationDataReader):  # type: ignore[misc]
    """Feeds the training split in fixed-size batches, in order, for INT8 calibration."""

    def __init__(self, x: NDArray[np.float32], batch_size: int = CALIBRATION_BATCH) -> None:
        self._batches: Iterator[NDArray[np.float32]] = iter(
            [x[i : i + batch_size] for i in range(0, len(x), batch_size)]
        )

    def get_next(self) -> dict[str, NDArray[np.float32]] | None:
        batch = next(self._batches, None)
        return None if batch is None else {INPUT_NAME: batch}


def quantize(fp32_path: Path, int8_path: Path, calibration: NDArray[np.float32]) -> None:
    """Static INT8 quantization (QDQ, int8 weights per channel, uint8 activations, MinMax calibration)."""
    with tempfile.TemporaryDirectory() as tmp:
        prepped = Path(tmp) / "prepped.onnx"
        quant_pre_process(str(fp32_path), str(prepped), skip_optimization=True, skip_symbolic_shape=True)
        quantize_static(
            str(prepped),
            str(int8_path),
            TrainingSetReader(calibration),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
    model = onnx.load(str(int8_path))
    model.doc_string = "MLP(64) digits classifier, INT8 (static QDQ quantization)"
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(int8_path))


def predict_labels(model_path: Path, x: NDArray[np.float32]) -> NDArray[np.int64]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    labels: list[NDArray[np.int64]] = []
    for i in range(0, len(x), MAX_BATCH_SIZE):
        (label,) = session.run([LABEL_NAME], {INPUT_NAME: x[i : i + MAX_BATCH_SIZE]})
        labels.append(np.asarray(label, dtype=np.int64))
    return np.concatenate(labels).reshape(-1)


def evaluate(model_path: Path, split: Split) -> tuple[int, int]:
    """(correct, n_test) of the ONNX file on the held-out split, run in onnxruntime."""
    predicted = predict_labels(model_path, split.x_test)
    return int(np.sum(predicted == split.y_test)), len(split.y_test)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def config_pbtxt(name: str, variant: str, accuracy: float, n_test: int) -> str:
    params = {
        "variant": variant,
        "variant_of": MODEL_NAME,
        "accuracy": repr(accuracy),
        "accuracy_dataset": dataset_description(n_test),
    }
    if name == MODEL_NAME:
        # The base model may be served by a variant at no less than 99.5 % of its accuracy (inference/variants.py).
        params["accuracy_floor"] = "0.995"
        params["variants"] = f"{MODEL_NAME}_int8"
    parameters = "\n".join(
        f'parameters: {{\n  key: "{key}"\n  value: {{ string_value: "{value}" }}\n}}'
        for key, value in params.items()
    )
    return f"""name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {MAX_BATCH_SIZE}
input [
  {{
    name: "{INPUT_NAME}"
    data_type: TYPE_FP32
    dims: [ {N_FEATURES} ]
  }}
]
output [
  {{
    name: "{PROBA_NAME}"
    data_type: TYPE_FP32
    dims: [ {N_CLASSES} ]
  }},
  {{
    name: "{LABEL_NAME}"
    data_type: TYPE_INT64
    dims: [ 1 ]
  }}
]
dynamic_batching {{
  preferred_batch_size: [ 16, 64 ]
  max_queue_delay_microseconds: 1000
}}
instance_group [
  {{
    count: 1
    kind: KIND_CPU
  }}
]
{parameters}
"""


def validate_config(text: str, name: str) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig()
    text_format.Parse(text, config)
    if config.name != name or config.platform != "onnxruntime_onnx":
        raise ValueError(f"bad config for {name}: {config.name!r} / {config.platform!r}")
    if [i.name for i in config.input] != [INPUT_NAME] or [o.name for o in config.output] != [
        PROBA_NAME,
        LABEL_NAME,
    ]:
        raise ValueError(f"bad tensors in config for {name}")
    return config


def write_model(out_dir: Path, name: str, variant: str, onnx_path: Path, split: Split) -> dict[str, object]:
    correct, n_test = evaluate(onnx_path, split)
    accuracy = correct / n_test
    config = config_pbtxt(name, variant, accuracy, n_test)
    validate_config(config, name)
    (out_dir / name / "config.pbtxt").write_text(config)
    report: dict[str, object] = {
        "model": name,
        "variant": variant,
        "accuracy": accuracy,
        "correct": correct,
        "n_test": n_test,
        "dataset": dataset_description(n_test),
        "split_seed": SPLIT_SEED,
        "onnxruntime_version": ort.__version__,
        "sklearn_version": sklearn.__version__,
        "sha256": sha256(onnx_path),
    }
    (out_dir / name / "accuracy.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def build(out_dir: Path) -> list[dict[str, object]]:
    split = load_split()
    model = train(split)

    fp32_path = out_dir / MODEL_NAME / "1" / "model.onnx"
    int8_path = out_dir / INT8_NAME / "1" / "model.onnx"
    fp32_path.parent.mkdir(parents=True, exist_ok=True)
    int8_path.parent.mkdir(parents=True, exist_ok=True)

    onnx.save(to_onnx(model), str(fp32_path))
    quantize(fp32_path, int8_path, split.x_train)

    reports = [
        write_model(out_dir, MODEL_NAME, "fp32", fp32_path, split),
        write_model(out_dir, INT8_NAME, "int8", int8_path, split),
    ]
    fp32_acc, int8_acc = (float(str(r["accuracy"])) for r in reports)
    if int8_acc < fp32_acc - 0.01:
        raise RuntimeError(f"INT8 accuracy {int8_acc:.4f} is more than 1 pp below FP32 {fp32_acc:.4f}")
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "out_dir",
        nargs="?",
        type=Path,
        default=Path(__file__).resolve().parent,
        help="model repository root (default: this script's directory)",
    )
    args = parser.parse_args()
    for report in build(args.out_dir):
        size = (args.out_dir / str(report["model"]) / "1" / "model.onnx").stat().st_size
        print(
            f"{report['model']:12s} {report['variant']:5s} accuracy={report['accuracy']:.4f} "
            f"({report['correct']}/{report['n_test']}) size={size} B sha256={report['sha256']}"
        )


if __name__ == "__main__":
    main()
