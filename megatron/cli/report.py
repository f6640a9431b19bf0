"""megatron-report: an HTML page and PNGs of one run or several, from their metrics.jsonl."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from megatron.cli.common import entry_point

EXAMPLES = """\
examples:
  # one run (in progress or finished): writes report/index.html and report/*.png
  megatron-report runs/tiny

  # several runs side by side (one colour each in every panel), into a folder of your choice:
  megatron-report runs/a runs/b runs/c --output reports/abc

  # from a login node, on a run's folder on the shared file system; then copy or open the page:
  megatron-report /lustre/orion/proj/runs/175b -o ~/www/175b
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="megatron-report",
        description="Plot what runs logged in metrics.jsonl: loss (train, valid, test), learning "
                    "rate,\ngradient norm, tokens/s, TFLOP/s per GPU, MFU, memory and the loss "
                    "scale, with\nevery event the trainer logs (saves, stops, spikes, "
                    "rollbacks, divergence, hangs,\nunresponsive ranks, stragglers, silent data "
                    "errors) marked and listed with its rank\nand node. Writes one "
                    "self-contained HTML page (the PNGs embedded) and a PNG per panel.\nWorks on "
                    "a run in progress; lines that are not records (a line being written, what "
                    "a\ncrash left) are skipped, each named in a warning and in the page.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (run.dir)")
    p.add_argument("-o", "--output", default="report", help="folder for index.html and the "
                   "PNGs (default: ./report)")
    return p


@entry_point("megatron-report")
def main(argv: Optional[List[str]] = None) -> int:
    from megatron.training.report import write_report

    a = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    written = write_report(a.run_dirs, a.output)
    for line in written.skipped:
        print(f"megatron-report: warning: skipped {line}", file=sys.stderr)
    print(f"wrote {written.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
