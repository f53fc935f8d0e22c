"""Small model repositories for gateway tests, written into a temporary folder."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np

DEMO = Path(__file__).resolve().parents[2] / "inference" / "demo_repository"


def linear_reference(x: np.ndarray) -> np.ndarray:
    """The reference model's arithmetic, recomputed independently of the served model."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256), dtype=np.float32) / 16.0
    b = rng.standard_normal((256,), dtype=np.float32)
    return (x @ w + b).astype(np.float32)


def python_model(root: Path, name: str, config: str, code: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(textwrap.dedent(config))
    (root / name / "1" / "model.py").write_text(textwrap.dedent(code))


def build_test_repository(root: Path, remote_down_url: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(DEMO / "linear", root / "linear")
    shutil.copytree(DEMO / "digits", root / "digits")
    python_model(
        root,
        "echo_bytes",
        """
        name: "echo_bytes"
        backend: "python"
        max_batch_size: 8
        input [ { name: "text", data_type: TYPE_STRING, dims: [ 1 ] } ]
        output [ { name: "upper", data_type: TYPE_STRING, dims: [ 1 ] },
                 { name: "length", data_type: TYPE_INT32, dims: [ 1 ] } ]
        dynamic_batching { max_queue_delay_microseconds: 500 }
        """,
        """
        import numpy as np

        class Model:
            def execute(self, inputs):
                text = inputs["text"]
                upper = np.array([[v.upper()] for v in text.ravel()], dtype=object)
                length = np.array([[len(v)] for v in text.ravel()], dtype=np.int32)
                return {"upper": upper, "length": length}
        """,
    )
    python_model(
        root,
        "flaky",
        """
        name: "flaky"
        backend: "python"
        max_batch_size: 4
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 2 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 2 ] } ]
        """,
        """
        class Model:
            def execute(self, inputs):
                x = inputs["x"]
                if (x < 0).any():
                    raise RuntimeError("negative input is not allowed")
                return {"y": x * 2}
        """,
    )
    python_model(
        root,
        "slow",
        """
        name: "slow"
        backend: "python"
        max_batch_size: 1
        input [ { name: "x", data_type: TYPE_FP32, dims: [ 1 ] } ]
        output [ { name: "y", data_type: TYPE_FP32, dims: [ 1 ] } ]
        dynamic_batching {
          preferred_batch_size: [ 1 ]
          default_queue_policy { max_queue_size: 1 }
        }
        parameters { key: "adaptive_delay" value: { string_value: "false" } }
        """,
        """
        import time

        class Model:
            def execute(self, inputs):
                time.sleep(float(inputs["x"][0, 0]))
                return {"y": inputs["x"]}
        """,
    )
    remote_dir = root / "remote_down"
    (remote_dir / "1").mkdir(parents=True)
    (remote_dir / "config.pbtxt").write_text(
        textwrap.dedent(
            f"""
            name: "remote_down"
            backend: "python"
            max_batch_size: 8
            input [ {{ name: "x", data_type: TYPE_FP32, dims: [ 256 ] }} ]
            output [ {{ name: "y", data_type: TYPE_FP32, dims: [ 256 ] }} ]
            parameters {{ key: "remote" value: {{ string_value: "triton" }} }}
            parameters {{ key: "remote_url" value: {{ string_value: "{remote_down_url}" }} }}
            parameters {{ key: "remote_model" value: {{ string_value: "linear" }} }}
            """
        )
    )
    (root / "broken").mkdir()
    (root / "broken" / "config.pbtxt").write_text('name: "broken"\nmax_batch_size: "lots"\n')
    return root
