#!/usr/bin/env bash
# The whole GPU verification in one command (under 8 minutes on an H200), with the machine's own
# torch and triton: nothing is installed. Runs the GPU-marked tests (every kernel on CUDA tensors
# against float64 references, graph capture, torch.compile), then the benchmarks in quick mode, and
# writes bench/results/<date>-<gpu>.{md,json,png} plus the test log. If $OUT is set (the device
# tool's output folder), the results are copied there too.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 RLX_TRITON_TUNE_CACHE="${RLX_TRITON_TUNE_CACHE:-/tmp/rlx_triton_tune.tsv}"
PY=${PYTHON:-python3}
RESULTS=bench/results
mkdir -p "$RESULTS"
stamp=$(date +%F)

if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA GPU visible to torch" >&2
  exit 2
fi
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

gpu=$($PY -c "import torch; print(''.join(c if c.isalnum() else '-' for c in torch.cuda.get_device_name()).strip('-').lower())")
log="$RESULTS/$stamp-$gpu-tests.log"
echo "== GPU tests (log: $log)"
timeout 270 $PY -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$log"
tests_rc=${PIPESTATUS[0]}

echo "== benchmarks (quick)"
timeout 180 $PY bench/run.py --quick --out "$RESULTS"
bench_rc=$?

echo "== summary: tests exit $tests_rc, benchmarks exit $bench_rc"
if [ -n "${OUT:-}" ]; then
  cp "$RESULTS/$stamp-$gpu"* "$OUT"/ 2>/dev/null || true
fi
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
