"""Checkpoints of experts split over expert-parallel ranks (docs/moe.md): a run saved at step 5
at EP4 (4 ranks, ZeRO-0 and ZeRO-1) continues to step 10 at EP2 (2 ranks, ZeRO-1 and ZeRO-0) and
on one process; one saved at EP2 x TP2 (SP) x DP2 continues at EP2 x TP2 x PP2, at EP2 x TP2 x
PP2 in ZB-V's model chunks and on one process; one saved from ZB-V's chunks at EP2 x PP2
continues on one process. Steps 6-10 must match the uninterrupted source run. The EP4 run
merged to one file (megatron-convert to-single) starts EP2 and one process from the same
weights (checkpoint.init_from: each rank takes its experts' slice). The checkpoint
stores each expert tensor on its global expert axis [E, ...] (checkpoint/experts.py), with the
fp32 masters and Adam moments, so any expert-parallel size reads its own experts' range. fp32,
dropless, no dropout.

Run by path under torchrun, this file is also the worker: one launch per world size (DeepSpeed's
start-up is the slow part); rank 0 writes {case: losses}."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import pytest

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))))
from tests.support.moe import MOE  # noqa: E402
from tests.support.paths import TINY  # noqa: E402

# the router bias (kept in the checkpoint, on pipeline stages too) and a shared expert
BIAS = ["model.moe.router_bias_update_rate=0.01", "model.moe.shared_expert_ffn_hidden_size=48"]
ZBV = ["parallel.pipeline_schedule=zbv", "parallel.virtual_pipeline_size=2"]
LAYOUTS = {
    "ep4_zero0": ["parallel.expert_parallel_size=4", "parallel.zero_stage=0"],
    "ep4_zero1": ["parallel.expert_parallel_size=4", "parallel.zero_stage=1"],
    "ep2_zero1": ["parallel.expert_parallel_size=2", "parallel.zero_stage=1"],
    "ep2_zero0": ["parallel.expert_parallel_size=2", "parallel.zero_stage=0"],
    # experts over the TP ranks (sequence parallel), two data-parallel replicas ...
    "ep2_tp2_dp2": ["parallel.expert_parallel_size=2", "parallel.tensor_parallel_size=2",
                    "parallel.sequence_parallel=true", "parallel.zero_stage=1", *BIAS],
    # ... continued on two pipeline stages instead
    "ep2_tp2_pp2": ["parallel.expert_parallel_size=2", "parallel.tensor_parallel_size=2",
                    "parallel.sequence_parallel=true", "parallel.pipeline_parallel_size=2",
                    "parallel.zero_stage=1", *BIAS],
    # ... or on two stages of two model chunks each in ZB-V's V (engine/interleaved.py)
    "ep2_tp2_pp2_zbv": ["parallel.expert_parallel_size=2", "parallel.tensor_parallel_size=2",
                        "parallel.sequence_parallel=true", "parallel.pipeline_parallel_size=2",
                        "parallel.zero_stage=1", *ZBV, *BIAS],
    # saved from model chunks (rank 0 holds layers 0 and 3, rank 1 layers 1 and 2; each
    # writes its own MoE layer's router bias)
    "ep2_pp2_zbv": ["parallel.expert_parallel_size=2", "parallel.pipeline_parallel_size=2",
                    "parallel.zero_stage=1", *ZBV, *BIAS],
    "one": [],
    "one_bias": BIAS,
}
LAUNCHES = {4: ("ep4_zero0,ep4_zero1,ep2_tp2_dp2,ep2_pp2_zbv",
                "ep2_tp2_dp2>ep2_tp2_pp2,ep2_tp2_dp2>ep2_tp2_pp2_zbv"),
            2: ("", "ep4_zero0>ep2_zero1,ep4_zero1>ep2_zero0"),
            1: ("", "ep4_zero1>one,ep4_zero0>one,ep2_tp2_dp2>one_bias,ep2_pp2_zbv>one_bias")}
# megatron-convert to-single of the EP4 run (written by the 4-rank launch), then a fresh run
# from it (checkpoint.init_from) at EP2 and on one process: each rank takes its experts' slice
SINGLE = "ep4_zero1"
INITS = {2: "ep2_zero1", 1: "one"}
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from tests.support.procs import launch_json
    work = tmp_path_factory.mktemp("moe_ckpt")
    out = {}
    for world in (4, 2, 1):
        sources, targets = LAUNCHES[world]
        extra = ["--single", SINGLE] if world == 4 else ["--inits", f"{SINGLE}:{INITS[world]}"]
        out.update(launch_json(world, os.path.abspath(__file__), str(work / f"out{world}.json"),
                               "--workdir", str(work), "--sources", sources,
                               "--targets", targets, *extra, plain_single=True))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", [t for w in (4, 2, 1) for t in LAUNCHES[w][1].split(",")])
def test_moe_checkpoint_continues_at_another_expert_parallel_size(results, case):
    src = case.split(">")[0]
    ref, got = results[src], results[case]
    assert len(got) == 5 and len(ref) == 5, (ref, got)
    diff = max(abs(a - b) for a, b in zip(ref, got))
    print(f"{case}: steps 6-10 max loss difference {diff:.3g}")
    assert diff < TOLERANCE, (case, diff, ref, got)


@pytest.mark.slow
def test_a_single_file_of_split_experts_starts_any_expert_parallel_size(results):
    """The EP4 run merged to one file starts fresh runs at EP2 (2 ranks) and on one process from
    the same weights: their first losses (the same first batch) agree, and are below the
    untrained model's first loss on that batch."""
    ep2, one = (results[f"{SINGLE}:{INITS[w]}"] for w in (2, 1))
    fresh = results[f"{SINGLE}/first"]
    print(f"first loss from the single file: EP2 {ep2}, one process {one}, fresh {fresh}")
    assert abs(ep2 - one) <= 1e-5 * one, (ep2, one)
    assert one < fresh - 0.05, (one, fresh)


def _config(layout: str, run_dir: str, *extra: str):
    from megatron.config import load_config
    return load_config(TINY, MOE + LAYOUTS[layout] + [f"run.dir={run_dir}", "checkpoint.save=true",
                                                      *extra])


def _rank0() -> bool:
    return os.environ.get("RANK", "0") == "0"  # before train() has a process group too


def _published(path: str, aside: str, write) -> None:
    """Rank 0 writes `aside` (write(aside)) and renames it to `path`; the other ranks wait for
    `path`, so none reads it part-written."""
    if _rank0():
        write(aside)
        os.rename(aside, path)
    while not os.path.exists(path):
        time.sleep(0.1)


def _target(workdir: str, src: str, dst: str):
    from megatron.training.loop import train
    new = os.path.join(workdir, f"{src}-to-{dst}")
    step = os.path.join(workdir, src, "checkpoints", "step_0000005")
    _published(new, new + ".part", lambda aside: shutil.copytree(
        step, os.path.join(aside, "checkpoints", "step_0000005")))
    summary = train(_config(dst, new, "checkpoint.load=auto"))
    assert summary.steps == 10, summary.steps
    return summary.losses


def _single(workdir: str, src: str) -> None:
    """megatron-convert to-single of `src`'s newest checkpoint into <workdir>/<src>.pt."""
    from megatron.checkpoint.convert import convert_to_single
    path = os.path.join(workdir, f"{src}.pt")
    _published(path, path + ".part.pt",
               lambda aside: convert_to_single(os.path.join(workdir, src), aside))


def _init(workdir: str, src: str, dst: str) -> float:
    """The first loss of a fresh run at layout `dst` from <workdir>/<src>.pt."""
    from megatron.training.loop import train
    run = os.path.join(workdir, f"{src}-init-{dst}")
    cfg = _config(dst, run, f"checkpoint.init_from={os.path.join(workdir, src + '.pt')}",
                  "training.train_iters=1", "checkpoint.save=false")
    return train(cfg).losses[0]


def _worker(out: str, workdir: str, sources, targets, single=None, inits=()) -> int:
    from megatron.training.loop import train
    results = {}
    for src in sources:
        cfg = _config(src, os.path.join(workdir, src), "checkpoint.save_interval=5")
        losses = train(cfg).losses
        results[src], results[f"{src}/first"] = losses[5:], losses[0]
    for case in targets:
        results[case] = _target(workdir, *case.split(">"))
    if single:
        _single(workdir, single)
    for case in inits:
        results[case] = _init(workdir, *case.split(":"))
    if _rank0():
        with open(out, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    from tests.support.worker_exit import exit_after
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--sources", default="")
    p.add_argument("--targets", default="")
    p.add_argument("--single", default=None)
    p.add_argument("--inits", default="")
    args = p.parse_args()
    exit_after(lambda: _worker(args.out, args.workdir, list(filter(None, args.sources.split(","))),
                               list(filter(None, args.targets.split(","))), args.single,
                               list(filter(None, args.inits.split(",")))))
