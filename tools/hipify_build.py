#!/usr/bin/env python3
"""Convert csrc/ (CUDA) into a HIP build tree with torch's hipify; the sources stay untouched.

    python tools/hipify_build.py --out build/hip

Copies csrc/kernels and csrc/bindings into OUT, runs torch.utils.hipify over the copy, writes
csrc/hip/compat_hip.h over the hipified compat header (HIP 5.2 has no __shfl_xor_sync and no
hip_bf16.h; that header provides the names device code uses), prints each conversion, and fails
when a CUDA-only name survives anywhere in the tree. OUT/manifest.json maps every source to its
hipified path. setup.py reaches this through tools/kernel_build.py on a ROCm build of torch.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
# What is hipified: device code and the torch bindings. csrc/data is plain C++.
TREES = ("kernels", "bindings")
COMPAT_CUDA = "kernels/compat.cuh"
COMPAT_HIP = Path("hip") / "compat_hip.h"
EXTENSIONS = (".cu", ".cuh", ".h", ".cpp")

# Names that must not reach the HIP compiler, each with the reason.
SURVIVORS: List[Tuple[str, str]] = [
    (r"\bcuda[A-Z]\w*", "CUDA runtime API or type that hipify did not map"),
    (r"\b__shfl(?:_up|_down|_xor)?_sync\b", "HIP 5.2 has no *_sync shuffles; use mf::shfl_xor"),
    (r"\b__(?:ballot|any|all|match_any|match_all)_sync\b|\b__activemask\b|\b__syncwarp\b",
     "warp-synchronous intrinsic missing from HIP 5.2"),
    (r"\b__nv_bfloat16\w*|\bnv_bfloat16\b|\b__hip_bfloat16\b",
     "bf16 type that needs hip_bf16.h (absent in HIP 5.2); use mf::bf16_t"),
    (r"[<\"](?:cuda_\w+\.h|hip/hip_bf16\.h|cub/[^>\"]*|hipcub/[^>\"]*)[>\"]",
     "CUDA-only or HIP-5.2-missing header"),
    (r"\b__CUDA_ARCH__\b", "undefined under HIP: a device-pass test would take the host branch"),
]

_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


class HipifyError(RuntimeError):
    """The hipified tree still names CUDA-only APIs (or hipify is unavailable)."""


@dataclass
class HipifyResult:
    out: Path
    # source path relative to csrc/ -> hipified path relative to out/
    converted: Dict[str, str] = field(default_factory=dict)

    def path(self, source: str) -> Path:
        return self.out / self.converted[source]


def find_survivors(root: Path) -> List[str]:
    """'file:line: name (why)' for each CUDA-only name left in code (comments are ignored)."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.suffix in EXTENSIONS + (".hip",)):
        text = _COMMENTS.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
        for pattern, why in SURVIVORS:
            for match in re.finditer(pattern, text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(root)}:{line}: {match.group(0)} ({why})")
    return found


def _run_hipify(out: Path) -> Dict[str, str]:
    try:
        from torch.utils.hipify import hipify_python
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        raise HipifyError(f"torch.utils.hipify is unavailable: {exc}") from exc
    # hipify keeps a module-level result table; a second call in one process would mix trees.
    hipify_python.HIPIFY_FINAL_RESULT.clear()
    result = hipify_python.hipify(
        project_directory=str(out), output_directory=str(out), includes=[str(out / "*")],
        extensions=EXTENSIONS, header_extensions=(".cuh", ".h"), show_progress=False,
        is_pytorch_extension=True, hip_clang_launch=True)
    converted = {}
    for src, res in result.items():
        dst = res.hipified_path or src
        converted[os.path.relpath(src, out)] = os.path.relpath(dst, out)
    return converted


# Written first into every tree this tool makes: the one mark that lets a later run delete it.
MARKER = ".hipify_build_tree"


class HipifyInputError(HipifyError):
    """--out or --csrc is wrong: the command exits 2, as every command of the project does."""


def check_paths(out: Path, csrc: Path) -> None:
    """The source tree holds what is converted, and `out` is a folder this tool may (re)create:
    new, empty, or one it made before. It deleted whatever --out named (`--out .` was the
    checkout) and took a missing --csrc for a traceback after deleting it."""
    missing = [tree for tree in TREES if not (csrc / tree).is_dir()]
    if missing or not (csrc / COMPAT_HIP).is_file():
        raise HipifyInputError(
            f"--csrc {str(csrc)!r} is not the CUDA source tree: expected the folders "
            f"{', '.join(TREES)} and {COMPAT_HIP} in it (csrc/ of this checkout); pass that folder")
    if out.exists() and not out.is_dir():
        raise HipifyInputError(f"--out {str(out)!r} is a file: expected a folder for the HIP "
                               f"tree; pass a new folder (default build/hip)")
    if out == csrc or out in csrc.parents:
        raise HipifyInputError(f"--out {str(out)!r} holds the source tree {str(csrc)!r}, and "
                               f"each run deletes its folder; pass a folder outside it "
                               f"(default build/hip)")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists() \
            and not (out / "manifest.json").exists():
        raise HipifyInputError(f"--out {str(out)!r} holds files this tool did not write, and "
                               f"each run deletes and recreates its folder; pass a new or empty "
                               f"folder (default build/hip)")


def hipify_tree(out: Path, csrc: Path = CSRC, log: Callable[[str], None] = print) -> HipifyResult:
    out, csrc = Path(out).resolve(), Path(csrc).resolve()
    check_paths(out, csrc)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("made by tools/hipify_build.py; deleted and recreated by it\n")
    for tree in TREES:
        shutil.copytree(csrc / tree, out / tree)
    converted = _run_hipify(out)
    # The tree keeps only HIP: drop each CUDA copy that hipify wrote under a new name.
    for src, dst in converted.items():
        if src != dst:
            (out / src).unlink()
    if COMPAT_CUDA not in converted:
        raise HipifyError(f"hipify did not process {COMPAT_CUDA}")
    shutil.copyfile(csrc / COMPAT_HIP, out / converted[COMPAT_CUDA])
    for src, dst in sorted(converted.items()):
        note = " (replaced by csrc/hip/compat_hip.h)" if src == COMPAT_CUDA else ""
        log(f"hipify: csrc/{src} -> {out.name}/{dst}{note}")
    source_of = {dst: src for src, dst in converted.items()}
    survivors = [f"{line} [from csrc/{source_of.get(line.split(':')[0], '?')}]"
                 for line in find_survivors(out)]
    if survivors:
        raise HipifyError("CUDA-only names survived hipify in " + str(out) + ":\n  " +
                          "\n  ".join(survivors))
    (out / "manifest.json").write_text(json.dumps(converted, indent=1, sort_keys=True) + "\n")
    return HipifyResult(out, converted)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python tools/hipify_build.py --out build/hip")
    parser.add_argument("--out", default=str(ROOT / "build" / "hip"),
                        help="build tree to (re)create (default: build/hip)")
    parser.add_argument("--csrc", default=str(CSRC), help="CUDA source tree (default: csrc/)")
    args = parser.parse_args(argv)
    try:
        result = hipify_tree(Path(args.out), Path(args.csrc))
    except HipifyError as exc:
        print(f"hipify_build: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, HipifyInputError) else 1
    print(f"hipify_build: {len(result.converted)} files in {result.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
