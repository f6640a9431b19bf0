#!/usr/bin/env bash
# Builds benchmarks/wheels/ (gitignored): the Python packages the GPU machine lacks, as wheels
# for its Python 3.12 on x86-64, so that benchmarks/gpu_check.sh can install them there with
# `pip install --no-index --no-deps` (that machine has no network).
#
#   bash benchmarks/gpu_prepare.sh            # uses .venv's versions; prints the folder's size
#
# What is missing there (its package list: torch, numpy, ninja, einops, msgpack, psutil,
# py-cpuinfo, tqdm, packaging, pybind11, pytest, ... but no deepspeed): DeepSpeed and the
# dependencies of it that the image does not hold: hjson, pydantic (+ pydantic-core, a
# compiled wheel, annotated-types, typing-inspection). typing-extensions is carried too because
# pydantic needs a recent one and the image's version is not known ahead.
#
# DeepSpeed is published as a source archive only: it is built here into a pure-Python wheel
# with DS_BUILD_OPS=0 (no op compiled ahead; the project never loads one: engine.py hands
# DeepSpeed a torch AdamW and switches the shm op off), so one wheel serves any Python 3.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
DEST=${WHEELS:-benchmarks/wheels}
# The image's interpreter (KINDS.md: Python 3.12.3 on x86-64, glibc new enough for 2_28).
PYVER=${GPU_PYTHON_VERSION:-3.12}
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux1_x86_64)

version_of() {  # the version .venv holds, so the GPU runs what the CPU tests ran
  "$PY" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'
}

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
ds=$(version_of deepspeed)
if [ -z "$ds" ]; then
  echo "gpu_prepare: deepspeed is not installed in $PY's environment; run 'make setup' first" >&2
  exit 1
fi

# DeepSpeed's setup.py imports torch, hence --no-build-isolation (the CPU torch of .venv is
# only read for version strings; no op is built). pip reuses its wheel cache when it can.
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "deepspeed==$ds"

platform_args=()
for p in "${PLATFORMS[@]}"; do platform_args+=(--platform "$p"); done
for name in hjson pydantic pydantic-core annotated-types typing-inspection typing-extensions; do
  v=$(version_of "$name")
  spec=$name${v:+==$v}
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" \
      --implementation cp "${platform_args[@]}" -d "$DEST" "$spec"
done

echo "gpu_prepare: wheels in $DEST:"
ls -1 "$DEST"
echo "gpu_prepare: $(du -sk "$DEST" | cut -f1) KiB in all (the device tool carries at most 64 MiB)"
