#!/usr/bin/env bash
# GPU check from a fresh checkout, in one go: build the fused kernels in place for this GPU,
# report the build, run the GPU parity tests, benchmark the kernels. Sized for a 10-minute slot
# (each stage has its own timeout, so a slow stage still leaves the earlier results behind).
#
#   bash benchmarks/gpu_check.sh            # results in benchmarks/results/
#   OUT=/some/dir bash benchmarks/gpu_check.sh
#
# Needs a GPU build of torch (CUDA or ROCm), its compiler (nvcc or hipcc) and pybind11; nothing
# is downloaded (--no-deps --no-index), so it also runs on machines without network access.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-benchmarks/results}
mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1
status=0

# Build only for the GPU in this machine unless told otherwise: each extra target costs time.
if $PY -c 'import sys, torch; sys.exit(0 if torch.version.hip else 1)'; then
  export PYTORCH_ROCM_ARCH=${PYTORCH_ROCM_ARCH:-$($PY -c \
    'import torch; print(torch.cuda.get_device_properties(0).gcnArchName.split(":")[0])')}
  echo "gpu_check: ROCm build for PYTORCH_ROCM_ARCH=$PYTORCH_ROCM_ARCH, MAX_JOBS=$MAX_JOBS"
else
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$($PY -c \
    'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}
  echo "gpu_check: CUDA build for TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, MAX_JOBS=$MAX_JOBS"
fi

start=$(date +%s)
if ! timeout 330 $PY -m pip install --no-build-isolation --no-deps --no-index -e . \
    >"$OUT_DIR/gpu_build.log" 2>&1; then
  echo "gpu_check: pip install -e . failed (see gpu_build.log); trying setup.py build_ext --inplace"
  timeout 300 $PY setup.py build_ext --inplace >>"$OUT_DIR/gpu_build.log" 2>&1 || status=1
fi
echo "gpu_check: build took $(( $(date +%s) - start ))s"

# The report must show every op built for this GPU and torch; --require fails otherwise.
$PY -m megatron.cli.kernels --require | tee "$OUT_DIR/kernels_report.txt" || status=1

timeout 240 $PY -m pytest -q -ra -p no:cacheprovider tests/gpu/test_fused_kernels.py \
    tests/gpu/test_native_norm_fallback.py \
    tests/unit/test_kernels_reference.py tests/unit/test_kernels_fused_wrappers.py \
    tests/unit/test_kernels_loader.py tests/unit/test_kernels_build_tools.py \
    >"$OUT_DIR/gpu_tests.log" 2>&1 || status=1
tail -n 15 "$OUT_DIR/gpu_tests.log"

timeout 150 $PY benchmarks/kernels/bench_kernels.py --out "$OUT_DIR" \
    2>&1 | tee "$OUT_DIR/bench_kernels.log" || status=1
echo "gpu_check: done in $(( $(date +%s) - start ))s, status $status"
exit $status
