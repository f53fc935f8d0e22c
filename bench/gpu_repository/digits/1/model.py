"""The demo ``digits`` MLP on cuda:0 with PyTorch, from the demo's own ONNX file (``weights.onnx``).

The file is skl2onnx's graph: Scaler, MatMul + Add, Relu, MatMul + Add, Softmax, ArgMax over ``classes``.
Its initializers and the Scaler's attributes are read here and the same operations run in PyTorch; a
graph of any other shape is refused rather than half understood.
"""

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

EXPECTED_OPS = [
    "Scaler", "Cast", "MatMul", "Add", "Relu", "MatMul", "Add", "Softmax", "Identity", "ArgMax",
    "ArrayFeatureExtractor", "Reshape", "Cast", "Reshape",
]  # fmt: skip


class Model:
    def initialize(self, args: dict) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "digits (GPU): PyTorch sees no CUDA device; serve inference/demo_repository instead"
            )
        path = Path(args["model_dir"]) / args["model_version"] / "weights.onnx"
        graph = onnx.load(str(path)).graph
        ops = [n.op_type for n in graph.node]
        if ops != EXPECTED_OPS:
            raise ValueError(f"{path}: not the demo digits graph (operators {ops})")
        init = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        scaler = {a.name: helper.get_attribute_value(a) for a in graph.node[0].attribute}
        dev = torch.device("cuda:0")
        self.device = dev

        def tensor(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.asarray(a, dtype=np.float32)).to(dev)

        self.offset = tensor(scaler["offset"])
        self.scale = tensor(scaler["scale"])
        self.w1, self.b1 = tensor(init["coefficient"]), tensor(init["intercepts"].reshape(-1))
        self.w2, self.b2 = tensor(init["coefficient1"]), tensor(init["intercepts1"].reshape(-1))
        self.classes = torch.from_numpy(init["classes"].astype(np.int64)).to(dev)
        self.execute({"input": np.zeros((1, 64), dtype=np.float32)})  # CUDA and cuBLAS start here

    def execute(self, inputs: dict) -> dict:
        x = torch.from_numpy(np.ascontiguousarray(inputs["input"], dtype=np.float32)).to(self.device)
        h = torch.relu(torch.addmm(self.b1, (x - self.offset) * self.scale, self.w1))
        p = torch.softmax(torch.addmm(self.b2, h, self.w2), dim=1)
        label = self.classes[torch.argmax(p, dim=1)].reshape(-1, 1)
        return {"probabilities": p.cpu().numpy(), "label": label.cpu().numpy()}
