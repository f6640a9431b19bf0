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
                    "scale, with\nsave, stop, spike, rollback and divergence events marked. "
                    "Writes one self-contained\nHTML page (the PNGs embedded) and a PNG per "
                    "panel. Works on a run in progress.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (run.dir)")
    p.add_argument("-o", "--output", default="report", help="folder for index.html and the "
                   "PNGs (default: ./report)")
    return p


@entry_point("megatron-report")
def main(argv: Optional[List[str]] = None) -> int:
    from megatron.checkpoint.records import RecordError
    from megatron.config.errors import InputError
    from megatron.training.report import write_report

    a = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        page = write_report(a.run_dirs, a.output)
    except RecordError as e:
        raise InputError(f"{e}: expected the metrics.jsonl lines megatron-train writes; fix or "
                         f"remove that line") from None
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
