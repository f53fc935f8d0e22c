"""Install carried wheels into a target folder, skipping what the machine already has at that version or newer.

Usage: ``python3 bench/device/install_wheels.py WHEEL_DIR TARGET`` (then ``export PYTHONPATH=TARGET``).

For the GPU machine lent to some sessions (bench/README.md, "On a GPU"): its Python (3.12, with PyTorch,
numpy, onnx, onnxruntime, nvidia-ml-py) lacks Django and the gateway's other dependencies, and nothing can be
fetched there. Its own newer copies of shared packages (protobuf, grpcio, click...) are kept, so torch and onnx
go on seeing what they were built with.
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version


def main(argv: list[str]) -> int:
    wheel_dir, target = Path(argv[0]), Path(argv[1])
    chosen: list[str] = []
    for wheel in sorted(wheel_dir.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        try:
            have = Version(metadata.version(name))
        except metadata.PackageNotFoundError:
            have = None
        if have is not None and have >= version:
            print(f"install_wheels: keeping {canonicalize_name(name)} {have} (carried {version})")
            continue
        chosen.append(str(wheel))
    print(f"install_wheels: installing {len(chosen)} wheels into {target}")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += ["--no-cache-dir", "--upgrade", "--target", str(target), *chosen]
    return subprocess.call(cmd) if chosen else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
