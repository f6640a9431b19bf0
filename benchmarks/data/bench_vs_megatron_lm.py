#!/usr/bin/env python3
"""megatron-preprocess against Megatron-LM's own tools/preprocess_data.py: the same JSON lines,
the same SentencePiece model, the same worker count, --append-eod, run alternately in one
benchmark run (ours, theirs, ours, theirs, ...), each as the command a user types (process
start-up included). Reports the wall time of each, their ratio (Megatron-LM's time over ours:
above 1.0 is faster than Megatron-LM) and whether the .bin/.idx files are byte-identical. Each
round also times both on a one-document input (start-up: imports, the worker pool, the
tokenizer), and a second ratio compares the times less that start-up: the tokenizing pipelines
alone.

Megatron-LM runs from its source in a separate virtual environment with megatron-core: the two
share the import name `megatron` and must not share an environment. One way to make it:

  python3 -m venv /tmp/mlm-venv
  /tmp/mlm-venv/bin/pip install torch==2.13.0 megatron-core==0.16.1 sentencepiece six regex \\
      pyyaml pydantic triton        # triton and the rest: imported by megatron.training
  # Megatron-LM's source at the tag of that megatron-core, without megatron/core (the wheel's):
  git -C Megatron-LM archive core_v0.16.1 tools/preprocess_data.py megatron/training \\
      megatron/legacy megatron/rl megatron/post_training | tar -x -C /tmp/mlm016
  mkdir /tmp/mlm016/src && mv /tmp/mlm016/megatron /tmp/mlm016/src/

examples:
  python benchmarks/data/bench_vs_megatron_lm.py --megatron-lm /tmp/mlm016 \\
      --python /tmp/mlm-venv/bin/python --workers 2 --rounds 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_preprocess import make_corpus  # noqa: E402
from common import ROOT, machine, save  # noqa: E402
from megatron.data.demo import prepare_demo_data  # noqa: E402


def _ours(corpus, model, out, workers):
    return [sys.executable, "-m", "megatron.cli.preprocess", "--input", corpus, "--output-prefix",
            out, "--tokenizer-type", "sentencepiece", "--tokenizer-model", model,
            "--append-eod", "--workers", str(workers), "--log-interval", "1000"], None


def _theirs(corpus, model, out, workers, mlm, python):
    env = dict(os.environ, PYTHONPATH=os.path.join(mlm, "src"))
    return [python, os.path.join(mlm, "tools", "preprocess_data.py"), "--input", corpus,
            "--output-prefix", out, "--tokenizer-type", "SentencePieceTokenizer",
            "--tokenizer-model", model, "--append-eod", "--workers", str(workers),
            "--log-interval", "100000"], env


def _timed(cmd, env, cwd) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} {cmd[1]} failed:\n{proc.stderr[-3000:]}")
    return seconds


def _same_files(a: str, b: str) -> bool:
    for ext in (".bin", ".idx"):
        with open(a + ext, "rb") as x, open(b + ext, "rb") as y:
            if x.read() != y.read():
                return False
    return True


MD = os.path.join(ROOT, "benchmarks", "results", "preprocess_vs_megatron_lm.md")


def _write_md(r: dict, m: dict) -> None:
    rows = [("wall s (median)", r["ours_median_s"], r["megatron_lm_median_s"]),
            ("MB/s", r["ours_mb_per_s"], r["megatron_lm_mb_per_s"]),
            ("start-up s (one document)", r["ours_startup_s"], r["megatron_lm_startup_s"])]
    lines = ["# megatron-preprocess against Megatron-LM's tools/preprocess_data.py", "",
             "Written by `benchmarks/data/bench_vs_megatron_lm.py` (also into `data.json`).", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GiB, Python "
             f"{m['python']}; load average at start {m['load_average_at_start'][0]:.1f} "
             f"({m['date']}), shared with other work. Corpus: {r['corpus']}; tokenizer: "
             f"{r['tokenizer']}; --append-eod; {r['workers']} workers each; {r['rounds']} "
             f"rounds, the two run alternately. Megatron-LM: {r['megatron_lm']}.", "",
             "| | megatron-preprocess | Megatron-LM |", "|---|---|---|"]
    lines += [f"| {name} | {a:.2f} | {b:.2f} |" for name, a, b in rows]
    lines += ["", f"- Ratio (Megatron-LM's wall time over ours, same worker count): "
                  f"**{r['ratio']:.2f}**; without each tool's start-up: "
                  f"**{r['ratio_without_startup']:.2f}**.",
              f"- Every run's seconds: ours {', '.join(f'{x:.2f}' for x in r['ours_s'])}; "
              f"Megatron-LM {', '.join(f'{x:.2f}' for x in r['megatron_lm_s'])}.",
              f"- The .bin/.idx files are byte-identical: {r['identical_files']}.",
              "- Megatron-LM's start-up imports torch and megatron.core/megatron.training; "
              "ours imports neither.", ""]
    with open(MD, "w") as f:
        f.write("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--megatron-lm", required=True, help="folder with tools/preprocess_data.py "
                   "and src/megatron (see the docstring)")
    p.add_argument("--python", required=True, help="the Python of Megatron-LM's venv")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--copies", type=int, default=4)
    a = p.parse_args()
    at_start = machine()
    demo = prepare_demo_data(os.path.join(ROOT, ".cache", "demo"))
    model = demo.tokenizer_model
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        docs = make_corpus(os.path.join(os.path.dirname(model), "shakespeare.jsonl"), corpus,
                           a.copies)
        mb = os.path.getsize(corpus) / 1e6
        one = os.path.join(tmp, "one.jsonl")
        with open(corpus) as f, open(one, "w") as g:
            g.write(f.readline())
        ours, theirs, ours_start, theirs_start = [], [], [], []
        for r in range(a.rounds):
            for src, name, times in ((corpus, f"ours{r}", ours), (one, "ours_one", ours_start)):
                cmd, env = _ours(src, model, os.path.join(tmp, name), a.workers)
                times.append(_timed(cmd, env, ROOT))
            for src, name, times in ((corpus, f"mlm{r}", theirs), (one, "mlm_one", theirs_start)):
                cmd, env = _theirs(src, model, os.path.join(tmp, name), a.workers,
                                   a.megatron_lm, a.python)
                times.append(_timed(cmd, env, tmp))
        identical = _same_files(os.path.join(tmp, "ours0_text_document"),
                                os.path.join(tmp, "mlm0_text_document"))
    o, t = statistics.median(ours), statistics.median(theirs)
    o1, t1 = statistics.median(ours_start), statistics.median(theirs_start)
    result = {"corpus": f"Shakespeare (demo), {docs:,} documents of ~4 KB, {mb:.1f} MB of JSON "
                        f"lines", "tokenizer": "SentencePiece BPE (demo, 4096 pieces)",
              "workers": a.workers, "rounds": a.rounds, "ours_s": ours, "megatron_lm_s": theirs,
              "ours_median_s": o, "megatron_lm_median_s": t, "ratio": t / o,
              "ours_mb_per_s": mb / o, "megatron_lm_mb_per_s": mb / t,
              "ours_startup_s": o1, "megatron_lm_startup_s": t1,
              "ratio_without_startup": (t - t1) / max(o - o1, 1e-9),
              "identical_files": identical,
              "megatron_lm": "tools/preprocess_data.py of Megatron-LM core_v0.16.1 with "
                             "megatron-core 0.16.1 (torch 2.13.0 CPU)"}
    save("vs_megatron_lm", result, at_start)
    _write_md(result, at_start)
    print(f"ours {o:.2f} s, Megatron-LM {t:.2f} s (median of {a.rounds}): ratio {t / o:.2f}; "
          f"start-up {o1:.2f} s and {t1:.2f} s, ratio without it "
          f"{result['ratio_without_startup']:.2f}; identical files: {identical}")


if __name__ == "__main__":
    main()
