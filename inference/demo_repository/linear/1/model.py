"""y = x @ W + b with W a fixed 256x256 FP32 matrix, plus a fixed per-batch cost.

Same W, b (numpy default_rng(0)) and 2 ms per batch as the linear model that bench/compare_triton.py
serves on a real Triton, so the two servers compare on equal work. The sleep
stands for a GPU kernel launch; PROBE_SLEEP_MS changes it as it does for the reference.
"""

import os
import time

import numpy as np


class Model:
    def initialize(self, args: dict) -> None:
        rng = np.random.default_rng(0)
        self.W = rng.standard_normal((256, 256), dtype=np.float32) / 16.0
        self.b = rng.standard_normal((256,), dtype=np.float32)
        self.sleep_s = float(os.environ.get("PROBE_SLEEP_MS", "2.0")) / 1000.0

    def execute(self, inputs: dict) -> dict:
        x = inputs["x"]
        if self.sleep_s > 0:
            time.sleep(self.sleep_s)
        return {"y": (x @ self.W + self.b).astype(np.float32)}
