"""y = x @ W + b on cuda:0 with PyTorch; W and b are the demo ``linear``'s (numpy default_rng(0))."""

import numpy as np
import torch


class Model:
    def initialize(self, args: dict) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "linear (GPU): PyTorch sees no CUDA device; serve inference/demo_repository instead"
            )
        self.device = torch.device("cuda:0")
        rng = np.random.default_rng(0)
        w = rng.standard_normal((256, 256), dtype=np.float32) / 16.0
        b = rng.standard_normal((256,), dtype=np.float32)
        self.W = torch.from_numpy(w).to(self.device)
        self.b = torch.from_numpy(b).to(self.device)
        # cuBLAS and the CUDA context start on first use (hundreds of ms): not inside the first batch.
        self.execute({"x": np.zeros((1, 256), dtype=np.float32)})

    def execute(self, inputs: dict) -> dict:
        x = torch.from_numpy(np.ascontiguousarray(inputs["x"], dtype=np.float32)).to(self.device)
        y = torch.addmm(self.b, x, self.W)
        return {"y": y.cpu().numpy()}  # .cpu() waits for the kernel: the batch's time is the GPU's
