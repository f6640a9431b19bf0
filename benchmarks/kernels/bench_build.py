#!/usr/bin/env python3
"""What the torch headers cost the kernel build: each binding (csrc/bindings/*.cpp) compiled as
setup.py's build compiles it (g++ with torch's include paths and flags), as the tree has it
against the same file with <torch/extension.h> included first (the header the bindings used
before), and with Python's -g (sysconfig's CFLAGS) against the build's -g0, alternating.

    python benchmarks/kernels/bench_build.py --python build/cuda-torch-venv/bin/python

--python must be a CUDA build of torch (its ATen/cuda headers and pip's NVIDIA headers; the
wheel test, tests/e2e/test_kernels_cuda_wheel.py, leaves one in build/cuda-torch-venv); set
CUDA_HOME where torch's guess from `which nvcc` is not the toolkit (CUDA_HOME=/usr/local/cuda
here, as the wheel test sets it). Writes
kernel_build_times.json and .md: the median seconds of each variant over --rounds, and the
object's size.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BINDINGS = sorted((ROOT / "csrc" / "bindings").glob("*.cpp"))
VARIANTS = {  # name -> (extra flags, with torch/extension.h first)
    "tree, -g0 (the build)": (["-g0"], False),
    "tree, -g": (["-g"], False),
    "torch/extension.h, -g0": (["-g0"], True),
    "torch/extension.h, -g (before)": (["-g"], True),
}


def torch_flags(python: str) -> list:
    """Include paths and defines of the interpreter's torch, as tools/kernel_build.py adds
    them (pip's NVIDIA headers where the toolkit lacks cusparse.h)."""
    script = (
        "import json, site, sys, sysconfig\n"
        f"sys.path.insert(0, {str(ROOT / 'tools')!r})\n"
        "import torch.utils.cpp_extension as ext, kernel_build\n"
        "kernel_build.check_cuda_home(ext.CUDA_HOME)\n"
        "inc = ext.include_paths('cuda') + kernel_build.pip_cuda_includes(\n"
        "    ext.CUDA_HOME, site.getsitepackages()) + [sysconfig.get_paths()['include']]\n"
        "print(json.dumps({'inc': inc, 'cuda': bool(__import__('torch').version.cuda)}))\n")
    proc = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit(f"bench_build: {python} could not report torch's include paths:\n"
                 f"{proc.stderr[-2000:]}")
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["cuda"]:
        sys.exit(f"bench_build: --python {python} has a torch without CUDA; its ATen/cuda "
                 "headers need the CUDA libraries' headers: use a CUDA build of torch "
                 "(build/cuda-torch-venv after tests/e2e/test_kernels_cuda_wheel.py)")
    return ["-I" + p for p in got["inc"]]


def compile_once(source: Path, flags: list, extension_first: bool, out: Path) -> float:
    cmd = ["g++", "-DNDEBUG", "-fwrapv", "-O3", "-Wall", "-fPIC", "-std=c++20",
           "-DTORCH_API_INCLUDE_EXTENSION_H", f"-DTORCH_EXTENSION_NAME=_fused_{source.stem}",
           *flags, "-c", str(source), "-o", str(out)]
    if extension_first:
        cmd[1:1] = ["-include", "torch/extension.h"]
    begin = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - begin
    if proc.returncode != 0:
        sys.exit(f"bench_build: {' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="an interpreter with a CUDA build of torch")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    if shutil.which("g++") is None:
        sys.exit("bench_build: g++ is not installed")
    inc = torch_flags(args.python)
    times = {name: {b.stem: [] for b in BINDINGS} for name in VARIANTS}
    sizes = {name: {} for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for source in BINDINGS:
                for name, (flags, first) in VARIANTS.items():
                    obj = Path(tmp, f"{source.stem}.o")
                    times[name][source.stem].append(compile_once(source, inc + flags, first, obj))
                    sizes[name][source.stem] = obj.stat().st_size
    medians = {name: {b: statistics.median(t) for b, t in per.items()}
               for name, per in times.items()}
    base = "torch/extension.h, -g (before)"
    result = {"machine": f"{os.cpu_count()} cores", "rounds": args.rounds, "seconds": medians,
              "object_bytes": sizes,
              "ratio_to_before": {name: sum(m.values()) / sum(medians[base].values())
                                  for name, m in medians.items()}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_build_times.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# What the torch headers cost the kernel build", "",
             f"benchmarks/kernels/bench_build.py on {result['machine']}, median of "
             f"{args.rounds} rounds, g++ -O3 with torch's include paths, each binding of "
             "csrc/bindings compiled alone; 'torch/extension.h' is the header the bindings "
             "included before, '-g' Python's CFLAGS that the build now overrides with -g0.", "",
             "| variant | " + " | ".join(b.stem for b in BINDINGS) + " | all | x before |",
             "|---" * (len(BINDINGS) + 3) + "|"]
    for name, m in medians.items():
        lines.append(f"| {name} | " + " | ".join(f"{m[b.stem]:.1f} s" for b in BINDINGS) +
                     f" | {sum(m.values()):.1f} s | {result['ratio_to_before'][name]:.2f} |")
    lines.append("| object size | " + " | ".join(
        f"{sizes['tree, -g0 (the build)'][b.stem] / 1e6:.1f} MB (-g0), "
        f"{sizes[base][b.stem] / 1e6:.1f} MB (before)" for b in BINDINGS) + " | | |")
    (out / "kernel_build_times.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
