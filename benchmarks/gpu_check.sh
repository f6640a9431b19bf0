#!/usr/bin/env bash
# The GPU check in one go, sized for one 10-minute device call (issue 14):
#   1. install the carried wheels (DeepSpeed and the dependencies the machine lacks);
#   2. build the fused kernels in place for this GPU (python setup.py build_ext --inplace, in the
#      background: meanwhile the GPU runs what does not need them);
#   3. while it builds: the end-to-end benchmark's runs that need no fused kernel
#      (benchmarks/e2e/bench_e2e.py: the 1.3B GPT, bf16, ZeRO-1, the plain PyTorch peer and
#      kernels.mode=torch under ZeRO-1, ZeRO-0 and DeepSpeed's BF16_Optimizer, with the planner's
#      prediction), the MoE layer against Mixtral's in bf16
#      (benchmarks/moe/bench_layer.py --device cuda: the grouped GEMM's first GPU run), then
#      tests/gpu/test_training_gpu.py (fp16 dynamic loss scaling, bf16 with MFU),
#      tests/gpu/test_training_gpu_paths.py (async saves from CUDA state, the straggler timer's
#      events), tests/gpu/test_model_moe_gpu.py (the experts' paths in three dtypes, a bf16 MoE run)
#      and tests/gpu/test_model_documents_gpu.py (document masks and positions, head norms,
#      sliding windows through flash and SDPA),
#      three files side by side when pytest-xdist is there; one profiled step of the trainer
#      and of the peer (benchmarks/e2e/profile_step.py, into the logs);
#   4. megatron-kernels --require, the 1.3B run with fused kernels, the GPU parity tests, the
#      kernel benchmark (GB/s as a share of the memory bandwidth, against torch eager and torch's
#      native kernels).
# Every step runs under `timeout` inside one overall budget (GPU_CHECK_BUDGET seconds, default
# 540) and writes as it goes, so a step that times out still leaves the others' results.
# A second call in the same session can leave out what the first one settled:
# GPU_CHECK_SKIP="moe_layer train_tests" skips those steps by name; E2E_TORCH_RUNS,
# E2E_FUSED_RUNS and PROFILE_RUNS replace the run lists of e2e_torch, e2e_fused and profile;
# PROFILE_FUSED_RUNS profiles runs with fused kernels once they are built.
#
#   bash benchmarks/gpu_check.sh             # results in $OUT, else benchmarks/results/
#   bash benchmarks/gpu_check.sh --dry-run   # no GPU steps: wheels into a throwaway folder,
#                                            # tests/gpu collected (skipped), e2e --tiny on the CPU
#
# Files written to the results folder (at most 8, what the device tool brings back):
# gpu_check_<gpu>.txt (the summary), gpu_check_logs.tar.gz (every step's log), e2e_<gpu>.json/.md,
# kernels_<gpu>.json/.md, moe_layer_<gpu>.json/.md. Nothing is downloaded: pip runs with --no-index.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET:-540}
WHEELS=${WHEELS:-benchmarks/wheels}
OUT_DIR=${OUT:-benchmarks/results}
mkdir -p "$OUT_DIR" && OUT_DIR=$(cd "$OUT_DIR" && pwd)
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
LOGS=$WORK/logs
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
T0=$(date +%s)
status=0

elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(elapsed) )); }
SUMMARY=$LOGS/summary.txt
pack() {  # what a killed run still leaves behind: the summary so far and every log
  cp "$SUMMARY" "$OUT_DIR/gpu_check_$SLUG.txt" 2>/dev/null
  tar -czf "$OUT_DIR/gpu_check_logs.tar.gz" -C "$WORK" logs 2>/dev/null || true
}
note() { echo "gpu_check [$(elapsed)s] $*" | tee -a "$SUMMARY"; }

# excerpt NAME tail N | excerpt NAME grep PATTERN: lines of a step's log into the summary.
excerpt() {
  local f=$LOGS/$1.log
  [ -f "$f" ] || return 0
  if [ "$2" = tail ]; then tail -n "$3" "$f"; else grep -- "$3" "$f"; fi | tee -a "$SUMMARY"
}

# step NAME MAX_SECONDS COMMAND...: COMMAND under timeout (the smaller of MAX_SECONDS and what
# is left of the budget), output in logs/NAME.log, one summary line; returns COMMAND's status.
step() {
  local name=$1 max=$2 t rc began
  shift 2
  case " ${GPU_CHECK_SKIP:-} " in
    *" $name "*) note "$name: left out (GPU_CHECK_SKIP)"; return 98 ;;
  esac
  t=$(left)
  (( t > max )) && t=$max
  if (( t < 20 )); then
    note "$name: SKIPPED, the budget is spent"
    status=1
    return 99
  fi
  began=$(date +%s)
  timeout --kill-after=15 "$t" "$@" >"$LOGS/$name.log" 2>&1
  rc=$?
  case $rc in
    0) note "$name: ok in $(( $(date +%s) - began ))s" ;;
    124|137) note "$name: TIMED OUT after ${t}s (partial results kept)"; status=1 ;;
    *) note "$name: FAILED, exit $rc after $(( $(date +%s) - began ))s (logs/$name.log)"
       status=1 ;;
  esac
  pack
  return $rc
}

# --- 0. the machine --------------------------------------------------------------------------
GPU_NAME=$($PY -c 'import torch
print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null)
(( DRY )) && GPU_NAME=""
SLUG=$(echo "${GPU_NAME:-cpu}" | tr 'A-Z' 'a-z' | sed 's/[^a-z0-9]\+/_/g; s/^_//; s/_$//')
{ nvidia-smi -L 2>&1 || true; $PY -c 'import sys, torch; print("python", sys.version.split()[0],
  "torch", torch.__version__, "cuda", torch.version.cuda, "hip", torch.version.hip)'
  nvcc --version 2>&1 | tail -n 2 || true; echo "nproc $(nproc)"; } >"$LOGS/env.log" 2>&1
note "start: gpu '${GPU_NAME:-none}', budget ${BUDGET}s, MAX_JOBS=$MAX_JOBS, results in $OUT_DIR"

# --- 1. carried wheels -------------------------------------------------------------------------
# The GPU machine's python has no DeepSpeed; benchmarks/gpu_prepare.sh builds the wheels here.
SITE=/tmp/gpu_check_site
if (( DRY )); then
  # Only the install itself: into a throwaway folder, for the GPU machine's Python 3.12.
  step wheels 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target "$WORK/site" --python-version 3.12 --only-binary=:all: "$WHEELS"/*.whl
elif $PY -c 'import importlib.util as u, sys; sys.exit(0 if u.find_spec("deepspeed") else 1)'; then
  note "wheels: deepspeed is already importable; nothing installed"
elif ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  if step wheels 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target "$SITE" "$WHEELS"/*.whl; then
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  fi
  step deepspeed_import 120 $PY -c 'import deepspeed, pydantic; print("deepspeed",
    deepspeed.__version__, "pydantic", pydantic.VERSION)'
else
  note "wheels: deepspeed is missing and $WHEELS holds no wheels (run benchmarks/gpu_prepare.sh \
and carry $WHEELS); the training steps will fail"
  status=1
fi

# --- dry run on a CPU: what can run without a GPU -------------------------------------------------
if [ -z "$GPU_NAME" ]; then
  note "no GPU visible to torch$( (( DRY )) && echo ' (--dry-run)'): skipping the kernel build, \
megatron-kernels --require, the GPU tests' bodies, the 1.3B benchmark and the kernel benchmark"
  step gpu_tests_collect 180 $PY -m pytest -q -ra -p no:cacheprovider tests/gpu
  excerpt gpu_tests_collect tail 4
  step e2e_tiny 180 $PY benchmarks/e2e/bench_e2e.py --tiny --cpu --out "$OUT_DIR" \
      --work "$LOGS/e2e"
  excerpt e2e_tiny grep '^e2e '
  note "done (dry run), status $status"
  pack
  exit $status
fi

# --- 2. kernel build, in the background -----------------------------------------------------------
if $PY -c 'import sys, torch; sys.exit(0 if torch.version.hip else 1)'; then
  export PYTORCH_ROCM_ARCH=${PYTORCH_ROCM_ARCH:-$($PY -c \
    'import torch; print(torch.cuda.get_device_properties(0).gcnArchName.split(":")[0])')}
  ARCH="PYTORCH_ROCM_ARCH=$PYTORCH_ROCM_ARCH"
else
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$($PY -c \
    'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}
  ARCH="TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
fi
# Up to 330 s, and always some budget left for the steps that follow it.
BUILD_MAX=$(( $(left) > 450 ? 330 : $(left) * 2 / 3 ))
note "build: python setup.py build_ext --inplace, $ARCH, MAX_JOBS=$MAX_JOBS, up to ${BUILD_MAX}s"
BUILD_T0=$(date +%s)
( timeout --kill-after=15 "$BUILD_MAX" $PY setup.py build_ext --inplace >"$LOGS/build.log" 2>&1
  echo "$? $(( $(date +%s) - BUILD_T0 ))" >"$WORK/build.rc" ) &
BUILD_PID=$!
building() { [ ! -f "$WORK/build.rc" ]; }

# --- 3. GPU work that needs no fused kernel, while the build runs -------------------------------
E2E=(benchmarks/e2e/bench_e2e.py --out "$OUT_DIR" --work "$LOGS/e2e" --merge --timeout 200)
TORCH_RUNS=${E2E_TORCH_RUNS:-torch,torch_zero0,torch_bf16opt}
FUSED_RUNS=${E2E_FUSED_RUNS:-fused,fused_bf16opt}
step e2e_peer 150 $PY "${E2E[@]}" --runs peer --context "the kernel build running on the CPU"
excerpt e2e_peer grep '^e2e \|error'
torch_done=0
if building; then
  step e2e_torch 220 $PY "${E2E[@]}" --runs "$TORCH_RUNS" \
      --context "the kernel build running on the CPU"
  excerpt e2e_torch grep '^e2e \|error'
  torch_done=1
fi
step moe_layer 120 $PY benchmarks/moe/bench_layer.py --device cuda --out "$OUT_DIR"
excerpt moe_layer grep 'skipped\|Error\|does not run' 
# One step of the trainer (torch kernels; ZeRO-1 and BF16_Optimizer) and of the peer under
# torch.profiler: where the device's time goes, and how long it waits on the host
# (logs/profile/profile-*.txt; benchmarks/results/gpu_h200.md says what to look for).
# The BF16_Optimizer run's profile only where the steps after this one (about 225 s on the H200)
# keep their time: a 450 s budget profiles the trainer's ZeRO-1 run and the peer alone.
if [ -z "${PROFILE_RUNS:-}" ]; then
  PROFILE_RUNS=torch,torch_bf16opt,peer
  (( $(left) < 345 )) && PROFILE_RUNS=torch,peer
fi
step profile 200 $PY benchmarks/e2e/bench_e2e.py --runs "$PROFILE_RUNS" --profile \
    --timeout 100 \
    --out "$LOGS/profile" --work "$LOGS/profile"
excerpt profile grep '^e2e \|error'
busy_lines() {  # each profile's wall and device-busy line (profile_step.py) into the summary
  for f in "$1"/profile-*.txt; do [ -f "$f" ] && sed -n 3p "$f" | tee -a "$SUMMARY"; done
}
busy_lines "$LOGS/profile"
XDIST=()  # the three files side by side: small models, one GPU with room for all
$PY -c 'import xdist' 2>/dev/null && XDIST=(-n 3 --dist loadfile)
step train_tests 220 $PY -m pytest -q -ra -p no:cacheprovider "${XDIST[@]}" \
    tests/gpu/test_training_gpu.py tests/gpu/test_training_gpu_paths.py tests/gpu/test_model_moe_gpu.py \
    tests/gpu/test_model_documents_gpu.py
excerpt train_tests tail 8

# --- 4. the build's result -------------------------------------------------------------------
wait "$BUILD_PID"
read -r build_rc build_s <"$WORK/build.rc" || build_rc=1
note "build: exit $build_rc after ${build_s:-?}s (logs/build.log)"
(( build_rc == 0 )) || { status=1; excerpt build tail 20; }
step kernels_report 60 $PY -m megatron.cli.kernels --require
excerpt kernels_report tail 40

# --- 5. fused kernels on (and off, when not run yet), then the kernel tests and benchmark --------
runs=$FUSED_RUNS
(( torch_done )) || runs=$FUSED_RUNS,$TORCH_RUNS
step e2e_fused 240 $PY "${E2E[@]}" --runs "$runs"
excerpt e2e_fused grep '^e2e \|error'
if [ -n "${PROFILE_FUSED_RUNS:-}" ]; then  # runs with fused kernels, profiled once they are built
  step profile_fused 150 $PY benchmarks/e2e/bench_e2e.py --runs "$PROFILE_FUSED_RUNS" --profile \
      --timeout 100 --out "$LOGS/profile_fused" --work "$LOGS/profile_fused"
  busy_lines "$LOGS/profile_fused"
fi
step kernel_tests 200 $PY -m pytest -q -ra -p no:cacheprovider tests/gpu/test_kernels_fused.py \
    tests/gpu/test_kernels_native_norm_fallback.py tests/gpu/test_kernels_native_fallback.py
excerpt kernel_tests tail 8
QUICK=""
(( $(left) < 150 )) && QUICK=--quick  # smaller shapes and fewer repetitions when time is short
step bench_kernels 180 $PY benchmarks/kernels/bench_kernels.py --out "$OUT_DIR" $QUICK
excerpt bench_kernels tail 3

note "done, status $status; results in $OUT_DIR"
pack
for f in "$OUT_DIR"/e2e_"$SLUG".md "$OUT_DIR"/kernels_"$SLUG".md "$OUT_DIR"/moe_layer_"$SLUG".md; do
  [ -f "$f" ] && { echo; cat "$f"; }
done
echo
cat "$OUT_DIR/gpu_check_$SLUG.txt"
exit $status
