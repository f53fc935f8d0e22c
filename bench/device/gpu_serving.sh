#!/usr/bin/env bash
# bench/gpu_serving.py on the lent GPU machine: builds digits_cnn there (its PyTorch, on the GPU), serves it
# through the gateway with NVML metering and writes the JSON into $OUT. Run from the repository root there,
# with the gateway's wheels carried in .whl/ (bench/README.md, "On a GPU", says how they are fetched).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-serving-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 bench/device/install_wheels.py .whl /tmp/site > "$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 2; }
export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version,power.draw,power.limit --format=csv; python3 -c \
  "import django, torch, pynvml, sklearn, aiohttp; print('django', django.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'sklearn', sklearn.__version__)"; } \
  2>&1 | tee "$OUT/versions.txt"
timeout "${GPU_SERVING_TIMEOUT_S:-470}" python3 bench/gpu_serving.py --results-dir "$OUT" --keep-work "$@" \
  2>&1 | tee "$OUT/gpu_serving.log"
rc=${PIPESTATUS[0]}
for log in /tmp/gpu-serving-*/gateway/serve.log; do
  [ -f "$log" ] && tail -c 200000 "$log" > "$OUT/serve.log"
done
echo "gpu_serving: exited $rc"
exit "$rc"
