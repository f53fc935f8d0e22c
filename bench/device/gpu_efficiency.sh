#!/usr/bin/env bash
# bench/efficiency.py on the lent GPU machine, with linear and digits computed on the GPU (bench/gpu_repository)
# and metered by NVML. Run from the repository root there, with the gateway's wheels carried in .whl/
# (bench/README.md, "On a GPU", says how they are fetched). Everything it keeps goes to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-efficiency-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 bench/device/install_wheels.py .whl /tmp/site > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 2; }
export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version,power.draw,power.limit --format=csv; python3 -c \
  "import django, torch, pynvml, onnxruntime, numpy; print('django', django.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__, 'onnxruntime', onnxruntime.__version__)"; } \
  2>&1 | tee "$OUT/versions.txt"
timeout "${EFFICIENCY_TIMEOUT_S:-480}" python3 bench/efficiency.py --repository bench/gpu_repository \
  --results-dir "$OUT" --keep-work "$@" 2>&1 | tee "$OUT/efficiency.log"
rc=${PIPESTATUS[0]}
for log in /tmp/efficiency-*/*/serve.log; do
  [ -f "$log" ] && tail -c 200000 "$log" > "$OUT/serve-$(basename "$(dirname "$log")").log"
done
echo "gpu_efficiency: efficiency.py exited $rc"
exit "$rc"
