"""megatron-kernels: which fused kernels are built, for which GPUs, and whether they run here."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import List, Optional

from megatron.cli.common import entry_point

EXAMPLES = """\
examples:
  # what is built, for which architectures, and whether it runs on this GPU and torch:
  megatron-kernels

  # the same as JSON (for scripts and CI logs):
  megatron-kernels --json

  # fail (exit 1) unless every fused op runs here, e.g. after building on a compute node:
  megatron-kernels --require

  # build the kernels ahead of time (no compiler ever runs at training time):
  PYTORCH_ROCM_ARCH=gfx90a pip install --no-build-isolation -e .      # MI250X (Frontier)
  PYTORCH_ROCM_ARCH="gfx90a;gfx942" pip install --no-build-isolation -e .  # + MI300X
  TORCH_CUDA_ARCH_LIST="8.0;9.0" pip install --no-build-isolation -e .     # A100 + H100/H200
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="megatron-kernels",
        description="Report the ahead-of-time fused kernel build (ops, target architectures, "
                    "the torch it was built with), whether it matches this GPU and torch, and "
                    "whether apex and flash-attn are present and usable. Never compiles.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--require", action="store_true",
                   help="exit 1 unless every fused op runs on this GPU (kernels.mode=fused "
                        "would start)")
    return p


def _text(report) -> List[str]:
    b = report.build
    lines = [f"torch       {report.torch_version} ({report.toolkit})",
             f"GPU         {report.gpu_name} ({report.gpu_arch})" if report.gpu_arch
             else "GPU         none visible to torch"]
    if b is None:
        lines.append(f"build       none installed ({report.build_info_path} is absent)")
        lines.append("            build on a machine with a ROCm or CUDA torch: pip install "
                     "--no-build-isolation -e . (see docs/kernels.md)")
    else:
        lines.append(f"build       {b.vendor} {b.toolkit}, torch {b.torch}, for "
                     f"{', '.join(b.archs)}{' +PTX' if b.ptx else ''} (built {b.built_at})")
        lines.append(f"match       {report.build_mismatch or 'yes: this GPU and torch'}")
    lines.append("")
    lines.append(f"{'op':<23}{'module':<19}{'built':<7}{'runs here':<11}why not")
    for s in report.ops:
        why = "" if s.runs_here else (s.reason or "")
        lines.append(f"{s.op:<23}{s.module or '-':<19}{'yes' if s.built else 'no':<7}"
                     f"{'yes' if s.runs_here else 'no':<11}{why}")
    lines.append("")
    for t in report.third_party:
        state = "usable" if t.usable else ("present, not usable" if t.present else "absent")
        version = f" {t.version}" if t.version else ""
        lines.append(f"{t.name:<12}{state}{version}: {t.detail}")
    if not all(s.runs_here for s in report.ops):
        lines.append("")
        lines.append("kernels.mode=auto uses the torch reference for ops that do not run here "
                     "(logged once); kernels.mode=fused refuses to start.")
    return lines


@entry_point("megatron-kernels")
def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from megatron.kernels.report import kernel_report
    report = kernel_report()
    if args.json:
        print(json.dumps(report.to_dict(), indent=1, default=str))
    else:
        print("\n".join(_text(report)))
    return 1 if args.require and not all(s.runs_here for s in report.ops) else 0


if __name__ == "__main__":
    sys.exit(main())
