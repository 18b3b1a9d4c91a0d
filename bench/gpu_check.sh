#!/usr/bin/env bash
# The whole GPU verification in one command (under 8 minutes on an H200, from a bare machine), with the
# machine's own torch and triton: nothing is installed. Named checks, each under its own time budget
# (`timeout`), so one that hangs costs its budget and the others still run:
#
#   bash bench/gpu_check.sh             every check, in order
#   bash bench/gpu_check.sh --list      each check with its budget, and their sum (at most 480 s)
#   bash bench/gpu_check.sh NAME ...    only those checks
#
# Results go to bench/results/<date>-<gpu>.{md,json,png} plus one log per check; if $OUT is set (the device
# tool's output folder), they are copied there too. Exit status 0 only when every check run passed.
#
# The image has no pyannote.audio: `bash bench/gpu_wheels.sh` (where PyPI is reachable) downloads the wheels
# it needs into .whl/ (ignored by git; carry it to the device machine), and when .whl/ exists the `wheels`
# check installs them into $WHEEL_SITE first, whichever checks are selected, so that the pyannote tests and
# the diarization bench run; without it they report why they did not.
set -uo pipefail
cd "$(dirname "$0")/.."

CHECKS=(env wheels gpu-tests graphs no-sync two-streams sanitizer multi-gpu rlx-flash bench diarization)
declare -A BUDGET=(
  [env]=10 [wheels]=25 [gpu-tests]=150 [graphs]=40 [no-sync]=30 [two-streams]=60 [sanitizer]=50 [multi-gpu]=10
  [rlx-flash]=15 [bench]=55 [diarization]=35
)
declare -A WHAT=(
  [env]="torch, triton, driver and GPU"
  [wheels]="pip install --no-index of .whl/ (pyannote.audio and what it needs beyond the image), if .whl/ exists"
  [gpu-tests]="every other GPU-marked test: each kernel on CUDA tensors vs float64, graphs, torch.compile"
  [graphs]="capture -> grow -> allocate -> replay: decode (counters back to 0, two streams), the PyanNet and trunk graphs"
  [no-sync]="torch.cuda.set_sync_debug_mode('error') around steady-state decode calls, a PyanNet and a ResNet34 forward"
  [two-streams]="two streams x LSTM at B=128 and B=512 (finish or refuse, never hang); diarization segmentation || embedding"
  [sanitizer]="compute-sanitizer memcheck and racecheck on small decode, varlen, SincNet, trunk and LSTM launches (if the binary exists)"
  [multi-gpu]="device guard: kernels on cuda:1 while cuda:0 is current (skipped on one GPU)"
  [rlx-flash]="torch.nn.attention.activate_flash_attention_impl(\"RLX\"): a decode-shaped F.sdpa vs torch's own flash"
  [bench]="the benchmarks in quick mode, but diarization"
  [diarization]="the SpeakerDiarization pipeline, stock vs optimized, seconds per stage (quick: 20 s of audio)"
)
# the tests the dedicated checks run (gpu-tests deselects them)
GRAPH_TESTS=(
  "tests/ops/test_sdpa_decode.py::test_cuda_graph_capture_grow_allocate_replay_keeps_its_own_counters"
  "tests/ops/test_sdpa_decode.py::test_cuda_graphs_replayed_concurrently_on_two_streams_never_share_counters"
  "tests/integrations/test_pyannote.py::test_cuda_graphs_capture_grow_allocate_replay_on_memory_of_their_own"
  "tests/integrations/test_pyannote_pipeline.py::test_get_embeddings_on_cuda_equal_stock"
)
NO_SYNC_TESTS=(
  "tests/ops/test_sdpa_decode.py::test_a_steady_state_decode_step_never_syncs_with_the_host"
  "tests/integrations/test_pyannote.py::test_a_steady_state_segmentation_forward_never_syncs_with_the_host"
  "tests/integrations/test_wespeaker.py::test_a_steady_state_embedding_forward_never_syncs_with_the_host"
)
TWO_STREAMS_TESTS=(
  "tests/triton/test_lstm.py::test_two_streams_of_lstm_forwards_at_batch_128_and_512_finish_or_refuse_never_hang"
  "tests/integrations/test_pyannote_overlap.py::test_on_cuda_the_overlap_engages_by_default_and_gives_the_sequential_embeddings"
)
MULTI_GPU_TESTS=(
  "tests/triton/test_launches.py::test_kernels_on_the_second_gpu_run_there_whichever_device_is_current"
)
RLX_FLASH_TESTS=(
  "tests/integrations/test_torch_attention.py::test_on_cuda_rlx_runs_a_decode_sdpa_call_and_gives_torchs_flash_result"
)

list_checks() {
  local total=0 name
  for name in "${CHECKS[@]}"; do
    printf '%-12s %4d s  %s\n' "$name" "${BUDGET[$name]}" "${WHAT[$name]}"
    total=$((total + BUDGET[$name]))
  done
  printf '%-12s %4d s\n' "total" "$total"
}

if [ "${1:-}" = "--list" ]; then
  list_checks
  exit 0
fi
selected=("$@")
[ ${#selected[@]} -eq 0 ] && selected=("${CHECKS[@]}")
for name in "${selected[@]}"; do
  if [ -z "${BUDGET[$name]+set}" ]; then
    echo "gpu_check: unknown check '$name'; checks: ${CHECKS[*]}" >&2
    exit 2
  fi
done
# the other checks import what the wheels install: `wheels` runs first whenever .whl/ is there
if compgen -G ".whl/*.whl" >/dev/null && [[ " ${selected[*]} " != *" wheels "* ]]; then
  selected=(wheels "${selected[@]}")
fi

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1 RLX_TRITON_TUNE_CACHE="${RLX_TRITON_TUNE_CACHE:-/tmp/rlx_triton_tune.tsv}"
PY=${PYTHON:-python3}
WHEEL_SITE=${WHEEL_SITE:-/tmp/rlx_triton_wheels}
RESULTS=bench/results
mkdir -p "$RESULTS"
stamp=$(date +%F)

if ! $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA GPU visible to torch" >&2
  exit 2
fi
gpu=$($PY -c "import torch; print(''.join(c if c.isalnum() else '-' for c in torch.cuda.get_device_name()).strip('-').lower())")
PYTEST=($PY -m pytest -q -p no:cacheprovider -m gpu -rs)

check_env() {
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(), torch.cuda.device_count(), 'GPU(s)')" &&
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; }
}
check_gpu-tests() {
  local deselect=() test
  for test in "${GRAPH_TESTS[@]}" "${NO_SYNC_TESTS[@]}" "${TWO_STREAMS_TESTS[@]}" "${MULTI_GPU_TESTS[@]}" \
    "${RLX_FLASH_TESTS[@]}"; do
    deselect+=(--deselect "$test")
  done
  timeout "$1" "${PYTEST[@]}" "${deselect[@]}" tests
}
check_graphs() { timeout "$1" "${PYTEST[@]}" "${GRAPH_TESTS[@]}"; }
check_no-sync() { timeout "$1" "${PYTEST[@]}" "${NO_SYNC_TESTS[@]}"; }
check_two-streams() { timeout "$1" "${PYTEST[@]}" "${TWO_STREAMS_TESTS[@]}"; }
check_multi-gpu() { timeout "$1" "${PYTEST[@]}" "${MULTI_GPU_TESTS[@]}"; }
check_rlx-flash() { timeout "$1" "${PYTEST[@]}" "${RLX_FLASH_TESTS[@]}"; }
check_sanitizer() {
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [ -z "$sanitizer" ]; then
    echo "skipped: compute-sanitizer not found (PATH, /usr/local/cuda*/bin)"
    return 0
  fi
  # every tensor its own allocation, so memcheck sees a read past one; half the budget per tool
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout $(($1 / 2)) "$sanitizer" --tool memcheck --error-exitcode 1 \
    $PY bench/gpu_sanitize.py decode varlen sincnet trunk lstm &&
    timeout $(($1 / 2)) "$sanitizer" --tool racecheck --error-exitcode 1 $PY bench/gpu_sanitize.py decode varlen sincnet trunk lstm
}
check_wheels() {
  if ! compgen -G ".whl/*.whl" >/dev/null; then
    echo "skipped: no .whl/ (bash bench/gpu_wheels.sh downloads the wheels pyannote.audio needs into it)"
    return 0
  fi
  rm -rf "${WHEEL_SITE:?}"
  timeout "$1" $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$WHEEL_SITE" .whl/*.whl &&
    echo "installed $(ls .whl/*.whl | wc -l) wheels into $WHEEL_SITE" &&
    PYTHONPATH="$PYTHONPATH:$WHEEL_SITE" PYANNOTE_METRICS_ENABLED=false timeout "$1" $PY -W ignore -c \
      "import pyannote.audio.pipelines as p, pyannote.audio as a; print('pyannote.audio', a.__version__, 'from', p.__file__)"
}
check_bench() {
  local names
  names=$($PY -c "from rlx_triton.perf.cases import BENCH_NAMES; print(' '.join(n for n in BENCH_NAMES if n != 'diarization'))") &&
    timeout "$1" $PY bench/run.py --quick --out "$RESULTS" $names
}
# its own report (the table in the log), so that a slow pipeline costs only this check
check_diarization() { timeout "$1" $PY bench/run.py --quick --json "$RESULTS/$stamp-$gpu-diarization.json" diarization; }

failed=()
for name in "${selected[@]}"; do
  log="$RESULTS/$stamp-$gpu-$name.log"
  echo "== $name (budget ${BUDGET[$name]} s; log: $log)"
  start=$SECONDS
  "check_$name" "${BUDGET[$name]}" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$log"
  if [ "$name" = wheels ] && [ "$rc" -eq 0 ] && [ -d "$WHEEL_SITE" ]; then
    export PYTHONPATH="$PYTHONPATH:$WHEEL_SITE" PYANNOTE_METRICS_ENABLED=false
  fi
  if [ "$rc" -eq 124 ]; then
    failed+=("$name (over its budget)")
  elif [ "$rc" -ne 0 ]; then
    failed+=("$name (exit $rc)")
  fi
done

if [ -n "${OUT:-}" ]; then
  cp "$RESULTS/$stamp-$gpu"* "$OUT"/ 2>/dev/null || true
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "== summary: failed: ${failed[*]}"
  exit 1
fi
echo "== summary: every check passed (${selected[*]})"
