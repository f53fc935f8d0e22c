"""Build ``digits_cnn``: a convolutional network for GPUs, trained end to end on scikit-learn's bundled digits
upsampled to 64x64, saved as TorchScript in FP32, FP16 and BF16 in a Triton-style model repository.

Usage (from the repository root, where PyTorch is installed: ``pip install -r requirements-torch.txt``)::

    .venv/bin/python scripts/build_gpu_demo_model.py OUT_DIR            # on CUDA when there is one
    .venv/bin/python scripts/build_gpu_demo_model.py OUT_DIR --width 8 --epochs 4 --kind KIND_CPU   # small

Writes, for each precision (``--precisions``, default fp32,fp16,bf16)::

    OUT_DIR/digits_cnn/config.pbtxt        1/model.pt   accuracy.json      (fp32, the base model)
    OUT_DIR/digits_cnn_fp16/config.pbtxt   1/model.pt   accuracy.json      (variant_of digits_cnn)
    OUT_DIR/digits_cnn_bf16/...
    OUT_DIR/build.json                     the network, its FLOPs per inference, the training log

The model takes the digits' 64 pixel values (0..16, as the demo ``digits`` model does) and upsamples them to
64x64 inside the network, so a request stays 64 numbers while the network computes on 64x64 images. Its
outputs are ``probabilities`` (FP32, 10) and ``label`` (INT64, 1): the demo ``digits``' interface. The
held-out split is build_digits.py's (stratified 25 %, ``random_state=42``, n=450); each saved file's accuracy
is measured by serving that split through the gateway's own PyTorch backend, and stored in ``accuracy.json``
and in its config's ``accuracy`` parameter. The FP32 model declares ``accuracy_floor`` and the half-precision
models are its variants (inference/variants.py): one whose accuracy falls below the floor is not used.

At the default width (128) one inference is 6.65 GFLOP (2 x the multiply-adds of the convolutions and the linear
layer; in build.json and each config), so a batch of 32 is 0.21 TFLOP: at the 50-200 TFLOP/s a data-centre
GPU sustains on such convolutions in FP32/TF32, 1-4 ms. Each model's accuracy.json records the measured
median time of a batch of 32 through the backend (``batch32_ms_median``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The backend imports PyTorch only when a model loads: these import without it.
from inference.backends.pytorch import PyTorchBackend  # noqa: E402
from inference.config import load_config  # noqa: E402
from inference.repository import GatewayOptions  # noqa: E402

MODEL_NAME = "digits_cnn"
SPLIT_SEED = 42
TEST_SIZE = 0.25
IMAGE_SIDE = 64
N_CLASSES = 10
MAX_BATCH_SIZE = 64
ACCURACY_FLOOR = 0.99
PRECISIONS = ("fp32", "fp16", "bf16")
DATASET = "sklearn digits upsampled to {side}x{side}, held-out 25 %, n=450"


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """build_digits.py's split: (x_train, x_test, y_train, y_test), pixels 0..16 as float32."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32), y.astype(np.int64), test_size=TEST_SIZE, stratify=y, random_state=SPLIT_SEED
    )
    return x_train, x_test, y_train, y_test


def make_network(torch: Any, width: int, side: int = IMAGE_SIDE) -> Any:
    nn = torch.nn

    def block(c_in: int, c_out: int) -> Any:
        return nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
        )

    class DigitsCNN(nn.Module):
        """64 pixels (0..16) -> 1x8x8 -> bilinear side x side (64) -> four conv blocks -> 10 classes."""

        def __init__(self) -> None:
            super().__init__()
            self.side = side  # an attribute: TorchScript reads no module globals
            w = width
            self.features = nn.Sequential(
                block(1, w),
                nn.MaxPool2d(2),
                block(w, 2 * w),
                nn.MaxPool2d(2),
                block(2 * w, 4 * w),
                nn.MaxPool2d(2),
                block(4 * w, 8 * w),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
            )
            self.classifier = nn.Linear(8 * w, N_CLASSES)

        def logits(self, x: torch.Tensor) -> torch.Tensor:
            images = (x / 16.0).reshape(-1, 1, 8, 8)
            images = torch.nn.functional.interpolate(
                images, size=(self.side, self.side), mode="bilinear", align_corners=False
            )
            return self.classifier(self.features(images))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            probabilities = torch.softmax(self.logits(x).float(), dim=1)
            return probabilities, probabilities.argmax(dim=1, keepdim=True)

    return DigitsCNN()


def flops_per_inference(torch: Any, model: Any) -> int:
    """2 x the multiply-adds of the convolutions and the linear layer for one 64-pixel input."""
    total = 0

    def conv_hook(module: Any, _inputs: Any, output: Any) -> None:
        nonlocal total
        k = module.kernel_size[0] * module.kernel_size[1]
        total += 2 * (module.in_channels // module.groups) * k * output.numel()

    def linear_hook(module: Any, _inputs: Any, output: Any) -> None:
        nonlocal total
        total += 2 * module.in_features * output.numel()

    handles = [
        m.register_forward_hook(conv_hook if isinstance(m, torch.nn.Conv2d) else linear_hook)
        for m in model.modules()
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))
    ]
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(1, 64))
    finally:
        for h in handles:
            h.remove()
    return total


def train(
    torch: Any, model: Any, x: np.ndarray, y: np.ndarray, args: argparse.Namespace, device: Any
) -> list[dict[str, Any]]:
    """Adam with a one-cycle schedule; random one-pixel shifts of the 8x8 image as augmentation."""
    gen = torch.Generator().manual_seed(args.seed)
    xt = torch.from_numpy(x).reshape(-1, 8, 8)
    yt = torch.from_numpy(y)
    steps_per_epoch = math.ceil(len(xt) / args.batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=args.epochs * steps_per_epoch
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    history = []
    model.train()
    for epoch in range(args.epochs):
        t0 = time.monotonic()
        order = torch.randperm(len(xt), generator=gen)
        seen, loss_sum, right = 0, 0.0, 0
        for start in range(0, len(xt), args.batch_size):
            idx = order[start : start + args.batch_size]
            images = xt[idx]
            shift = torch.randint(-1, 2, (2,), generator=gen).tolist()
            images = torch.roll(images, shifts=(shift[0], shift[1]), dims=(1, 2))
            batch = images.reshape(len(idx), 64).to(device)
            target = yt[idx].to(device)
            logits = model.logits(batch)
            loss = loss_fn(logits, target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            seen += len(idx)
            loss_sum += float(loss.detach()) * len(idx)
            right += int((logits.argmax(dim=1) == target).sum())
        history.append(
            {
                "epoch": epoch + 1,
                "loss": round(loss_sum / seen, 5),
                "train_accuracy": round(right / seen, 5),
                "seconds": round(time.monotonic() - t0, 3),
            }
        )
        print(f"build_gpu_demo_model: epoch {epoch + 1}/{args.epochs} {history[-1]}", flush=True)
    model.eval()
    return history


def model_name(precision: str) -> str:
    return MODEL_NAME if precision == "fp32" else f"{MODEL_NAME}_{precision}"


def config_text(
    precision: str, kind: str, accuracy: float, flops: int, variants: list[str], dataset: str
) -> str:
    group = "count: 1, kind: KIND_GPU, gpus: [ 0 ]" if kind == "KIND_GPU" else "count: 1, kind: KIND_CPU"
    params = {
        "precision": precision,
        "variant": precision,
        "accuracy": repr(accuracy),
        "accuracy_dataset": dataset,
        "flops_per_inference": str(flops),
    }
    if precision == "fp32":
        params["accuracy_floor"] = str(ACCURACY_FLOOR)
        if variants:
            params["variants"] = ",".join(variants)
    else:
        params["variant_of"] = MODEL_NAME
    lines = [
        f"# Built by scripts/build_gpu_demo_model.py: {precision.upper()} TorchScript, {flops:,} FLOP per inference.",
        f'name: "{model_name(precision)}"',
        'platform: "pytorch_libtorch"',
        f"max_batch_size: {MAX_BATCH_SIZE}",
        'input [ { name: "input", data_type: TYPE_FP32, dims: [ 64 ] } ]',
        "output [",
        '  { name: "probabilities", data_type: TYPE_FP32, dims: [ 10 ] },',
        '  { name: "label", data_type: TYPE_INT64, dims: [ 1 ] }',
        "]",
        "dynamic_batching {",
        "  preferred_batch_size: [ 32, 64 ]",
        "  max_queue_delay_microseconds: 1000",
        "}",
        f"instance_group [ {{ {group} }} ]",
    ]
    lines += [f'parameters: {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    return "\n".join(lines) + "\n"


def measure(model_dir: Path, x_test: np.ndarray, y_test: np.ndarray, timing_reps: int) -> dict[str, Any]:
    """Serve the held-out split through the gateway's PyTorch backend, as the gateway would, 64 rows a batch:
    the accuracy; then the median wall time of one batch of 32 through the same backend (the input's copy to
    the device, the network, the outputs' copy back)."""
    spec = load_config(model_dir)
    backend = PyTorchBackend(spec, "1", model_dir / "1", 0, GatewayOptions())
    try:
        labels = [
            backend.execute({"input": x_test[i : i + MAX_BATCH_SIZE]})["label"][:, 0]
            for i in range(0, len(x_test), MAX_BATCH_SIZE)
        ]
        batch = {"input": np.ascontiguousarray(x_test[:32])}
        times = []
        for i in range(3 + timing_reps):
            t0 = time.perf_counter()
            backend.execute(batch)
            if i >= 3:  # after three warm-up batches
                times.append(time.perf_counter() - t0)
    finally:
        backend.close()
    correct = int((np.concatenate(labels) == y_test).sum())
    return {
        "accuracy": correct / len(y_test),
        "correct": correct,
        "batch32_ms_median": round(statistics.median(times) * 1000, 3) if times else None,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="model repository to write the models into")
    p.add_argument("--width", type=int, default=128, help="channels of the first block (default 128)")
    p.add_argument("--epochs", type=int, default=20, help="training epochs (default 20)")
    p.add_argument(
        "--image-side",
        type=int,
        default=IMAGE_SIDE,
        help="side the 8x8 digits are upsampled to (default 64; smaller only for quick checks on a CPU)",
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--timing-reps", type=int, default=20, help="batches of 32 timed through the backend per model (20)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="PyTorch CPU threads (default 1: on a busy host its spinning workers cost more than they give)",
    )
    p.add_argument("--device", default="auto", help="training device: auto (cuda when present), cpu, cuda")
    p.add_argument(
        "--kind",
        default="auto",
        choices=("auto", "KIND_GPU", "KIND_CPU"),
        help="instance_group kind of the configs (auto: KIND_GPU where CUDA is present)",
    )
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="comma list, fp32 first (default all)")
    args = p.parse_args(argv)
    args.precision_list = [s.strip() for s in args.precisions.split(",") if s.strip()]
    if (
        not args.precision_list
        or args.precision_list[0] != "fp32"
        or set(args.precision_list) - set(PRECISIONS)
    ):
        p.error(f"--precisions: fp32 first, then any of {', '.join(PRECISIONS[1:])}")
    if args.width < 1 or args.epochs < 1 or args.image_side < 8:
        p.error("--width and --epochs must be at least 1, --image-side at least 8")
    return args


def build(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    torch.set_num_threads(max(1, args.threads))
    device = torch.device(
        "cuda" if args.device == "auto" and cuda else ("cpu" if args.device == "auto" else args.device)
    )
    kind = args.kind if args.kind != "auto" else ("KIND_GPU" if cuda else "KIND_CPU")
    torch.manual_seed(args.seed)
    x_train, x_test, y_train, y_test = load_split()
    model = make_network(torch, args.width, args.image_side)
    flops = flops_per_inference(torch, model)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"build_gpu_demo_model: width {args.width}, {params:,} parameters, {flops / 1e9:.3f} GFLOP per inference; "
        f"training on {device} for {args.epochs} epochs",
        flush=True,
    )
    t0 = time.monotonic()
    model.to(device)
    history = train(torch, model, x_train, y_train, args, device)
    train_s = time.monotonic() - t0
    model.cpu()
    args.out.mkdir(parents=True, exist_ok=True)
    variants = [model_name(p) for p in args.precision_list[1:]]
    dataset = DATASET.format(side=args.image_side)
    results: dict[str, Any] = {}
    for precision in args.precision_list:
        name = model_name(precision)
        model_dir = args.out / name
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
        copy = make_network(torch, args.width, args.image_side)
        copy.load_state_dict(model.state_dict())
        copy.eval().to(dtype)
        with warnings.catch_warnings():  # PyTorch 2.13 marks TorchScript deprecated; Triton reads it
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.jit.save(torch.jit.script(copy), str(model_dir / "1" / "model.pt"))
        # Measured with a provisional config (accuracy 0), then written with the figure.
        (model_dir / "config.pbtxt").write_text(
            config_text(precision, kind if cuda else "KIND_CPU", 0.0, flops, variants, dataset)
        )
        measured = measure(model_dir, x_test, y_test, args.timing_reps)
        accuracy, correct = measured["accuracy"], measured["correct"]
        (model_dir / "config.pbtxt").write_text(
            config_text(precision, kind, accuracy, flops, variants, dataset)
        )
        record = {
            "model": name,
            "variant": precision,
            "accuracy": accuracy,
            "correct": correct,
            "n_test": len(y_test),
            "dataset": dataset,
            "split_seed": SPLIT_SEED,
            "measured_on": "cuda" if cuda else "cpu",
            "torch_version": torch.__version__,
            "flops_per_inference": flops,
            "batch32_ms_median": measured["batch32_ms_median"],
            "sha256": hashlib.sha256((model_dir / "1" / "model.pt").read_bytes()).hexdigest(),
        }
        (model_dir / "accuracy.json").write_text(json.dumps(record, indent=2) + "\n")
        results[name] = record
        print(
            f"build_gpu_demo_model: {name}: held-out accuracy {accuracy:.4f} ({correct}/{len(y_test)}), "
            f"a batch of 32 in {measured['batch32_ms_median']} ms (median)",
            flush=True,
        )
    summary = {
        "network": "bilinear 8x8->64x64, 4 blocks of 2 conv3x3+BN+ReLU (w, 2w, 4w, 8w channels), max-pool, "
        "global average pool, linear",
        "width": args.width,
        "image_side": args.image_side,
        "parameters": params,
        "flops_per_inference": flops,
        "flops_batch_32": 32 * flops,
        "epochs": args.epochs,
        "train_seconds": round(train_s, 2),
        "train_device": str(device),
        "kind": kind,
        "history": history,
        "models": results,
    }
    (args.out / "build.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print(
            "build_gpu_demo_model: PyTorch is not installed: .venv/bin/pip install -r requirements-torch.txt",
            file=sys.stderr,
        )
        return 2
    build(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
