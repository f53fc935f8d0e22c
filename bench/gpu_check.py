"""Cross-check GPU energy methods under a matrix-multiply load.

Usage: ``python bench/gpu_check.py [--seconds N] [--index I] [--period-ms P]``

Runs a matmul loop on one GPU for ``--seconds`` (default 30, capped at 240 so
the whole check stays under 5 minutes) and compares, over the same window:

* the NVML energy counter delta (``nvml-counter``),
* integrated NVML power samples (``nvml-power-integration``),
* wall time x enforced power limit -- an upper bound on what the board may
  draw on average.

The load uses torch if importable, else cupy, else numpy on the CPU -- in that
last case the GPU is idle and the script says so (and applies no checks).
Without pynvml, NVML or a GPU it prints why it skipped and exits 0. Exit
status 1 means a check failed: the counter exceeded the power-limit bound, or
the two NVML methods disagreed by more than 15 %.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MAX_SECONDS = 240.0
AGREEMENT = 0.15
BOUND_SLACK = 1.05  # power limit is enforced on average; allow brief excursions/timing skew

Load = tuple[str, Callable[[], None], bool]


def _torch_load(index: int) -> Load | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    dev = torch.device(f"cuda:{index}")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.float16)
    b = torch.randn(n, n, device=dev, dtype=torch.float16)

    def step() -> None:
        # Queue several matmuls per sync so the GPU never waits for Python.
        for _ in range(8):
            torch.matmul(a, b)
        torch.cuda.synchronize(dev)

    return f"torch {torch.__version__} fp16 matmul {n}x{n} on cuda:{index}", step, True


def _cupy_load(index: int) -> Load | None:
    try:
        import cupy
    except ImportError:
        return None
    try:
        cupy.cuda.Device(index).use()
        n = 8192
        a = cupy.random.standard_normal((n, n), dtype=cupy.float32)
        b = cupy.random.standard_normal((n, n), dtype=cupy.float32)
    except Exception as exc:  # cupy raises its own CUDA error types
        print(f"gpu_check: cupy unusable ({exc})")
        return None

    def step() -> None:
        for _ in range(4):
            a @ b
        cupy.cuda.Device(index).synchronize()

    return f"cupy {cupy.__version__} fp32 matmul {n}x{n} on device {index}", step, True


def _numpy_load() -> Load:
    import numpy as np

    n = 512
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n))
    b = rng.standard_normal((n, n))

    def step() -> None:
        a @ b

    return f"numpy matmul {n}x{n} on the CPU (no torch/cupy): the GPU was idle", step, False


def _power_limit_w(nvml: Any, index: int) -> float | None:
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return None
    try:
        return float(nvml.nvmlDeviceGetEnforcedPowerLimit(nvml.nvmlDeviceGetHandleByIndex(index))) / 1000.0
    except nvml.NVMLError:
        return None
    finally:
        nvml.nvmlShutdown()


def main(argv: Sequence[str] | None = None, *, nvml_module: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=30.0, help="load duration (default 30, max 240)")
    parser.add_argument("--index", type=int, default=0, help="NVML GPU index (PCI bus order)")
    parser.add_argument("--period-ms", type=float, default=20.0, help="power sampling period (default 20)")
    args = parser.parse_args(argv)
    seconds = min(max(args.seconds, 0.1), MAX_SECONDS)

    # Runnable as a plain script from anywhere: make the repo importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from inference.meters import MeterError, NvmlMeter
    from inference.meters.nvml import import_pynvml, nvml_device_count

    try:
        nvml = nvml_module if nvml_module is not None else import_pynvml()
        count = nvml_device_count(nvml)
    except MeterError as exc:
        print(f"gpu_check: skipped: {exc}")
        return 0
    if count == 0:
        print("gpu_check: skipped: NVML works but reports no GPU")
        return 0
    if not 0 <= args.index < count:
        print(f"gpu_check: --index {args.index} out of range, NVML sees {count} GPU(s)")
        return 2

    # Make CUDA number devices like NVML (PCI bus order) before torch/cupy load.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    load = _torch_load(args.index) or _cupy_load(args.index) or _numpy_load()
    load_name, step, on_gpu = load

    try:
        integ = NvmlMeter(
            args.index,
            nvml_module=nvml,
            force_power_integration=True,
            sample_period_s=args.period_ms / 1000.0,
        )
    except MeterError as exc:
        print(f"gpu_check: FAIL: power readings unusable: {exc}")
        return 1
    try:
        counter: NvmlMeter | None = NvmlMeter(args.index, nvml_module=nvml)
    except MeterError as exc:
        print(f"gpu_check: energy counter unusable: {exc}")
        counter = None
    if counter is not None and counter.method != "nvml-counter":
        print(
            "gpu_check: this GPU/driver has no energy counter (pre-Volta?); comparing with integration only"
        )
        counter.close()
        counter = None
    limit_w = _power_limit_w(nvml, args.index)

    info = integ.device_info()
    print(
        f"gpu_check: GPU {args.index} {info.get('name', '?')} {info['uuid']} driver {info.get('driver_version', '?')}"
    )
    print(f"gpu_check: load: {load_name}; {seconds:g} s")

    try:
        for _ in range(3):  # warm-up: kernels compiled, clocks up
            step()
        meters = [m for m in (counter, integ) if m is not None]
        for m in meters:
            m.start()
        t0 = time.monotonic_ns()
        while time.monotonic_ns() - t0 < seconds * 1e9:
            step()
        readings = {m.method: m.read() for m in meters}
        wall_s = (time.monotonic_ns() - t0) / 1e9
    finally:
        integ.close()
        if counter is not None:
            counter.close()

    rows: list[tuple[str, float | None]] = [
        ("nvml-counter", readings["nvml-counter"].energy_j if "nvml-counter" in readings else None),
        ("nvml-power-integration", readings["nvml-power-integration"].energy_j),
        ("power-limit x wall (upper bound)", limit_w * wall_s if limit_w is not None else None),
    ]
    reference = rows[0][1] if rows[0][1] else rows[1][1]
    ref_name = "counter" if rows[0][1] else "integration"
    print(f"\n{'method':<34}{'joules':>12}{'avg W':>10}{f'ratio to {ref_name}':>22}")
    for name, joules in rows:
        if joules is None:
            print(f"{name:<34}{'n/a':>12}{'':>10}{'':>22}")
            continue
        ratio = f"{joules / reference:.3f}" if reference else "n/a"
        print(f"{name:<34}{joules:>12.1f}{joules / wall_s:>10.1f}{ratio:>22}")
    print(f"wall time {wall_s:.2f} s")

    if not on_gpu:
        print("gpu_check: GPU was idle (load ran on the CPU): no checks applied")
        return 0
    failures: list[str] = []
    counter_j, integ_j, bound_j = (j for _, j in rows)
    if counter_j is not None and bound_j is not None and counter_j > bound_j * BOUND_SLACK:
        failures.append(f"counter {counter_j:.1f} J exceeds power-limit bound {bound_j:.1f} J")
    if counter_j and integ_j is not None and abs(integ_j / counter_j - 1) > AGREEMENT:
        failures.append(f"integration/counter = {integ_j / counter_j:.3f}, outside 1 +/- {AGREEMENT}")
    for f in failures:
        print(f"gpu_check: FAIL: {f}")
    if not failures:
        print("gpu_check: OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
