"""megatron-plan: predict memory and throughput of 3D layouts, search, calibrate, project scaling."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional

from megatron.cli.common import count, entry_point, integer, number, positive_seconds
from megatron.config import schedules, variants
from megatron.config.sections.model import MODEL_LIMITS
from megatron.planner.grad_dtype import GRAD_DTYPES
from megatron.planner.hardware import FP8_PRESET_NAMES, PRESET_NAMES
from megatron.planner.overlap import FRAMEWORKS

# Beyond any cluster (about a million devices) and any global batch published; the search's
# divisor loops and the time model's sums stay fast and finite below them.
MAX_NODES = 2 ** 17
MAX_BATCH = 2 ** 30

EXAMPLES = """\
examples:
  # fastest layouts of the paper's 175B on 16 Frontier nodes; write the best as config + sbatch
  megatron-plan search --model 175b --cluster frontier --nodes 16 --global-batch 1280 \\
      --out-config best.yaml --out-sbatch best.sbatch
  # memory and time of one layout (the paper's 175B recipe); --schedule zbh1 prices ZB-H1
  megatron-plan memory --model 175b --cluster frontier --nodes 16 --global-batch 1280 \\
      --tp 4 --pp 16 --micro-batch 1 --zero 1 --recompute full [--schedule zbh1]
  # the same on H100 nodes with FP8 matrix multiplies and FP8 weights (priced only: this
  # trainer has no FP8; docs/planner.md "FP8")
  megatron-plan memory --model 175b --cluster h100 --nodes 16 --global-batch 256 \\
      --tp 4 --pp 8 --sp --recompute none --fp8 --fp8-params
  # a published model from its Hugging Face config.json (Qwen3-30B-A3B's experts priced too)
  megatron-plan search --model ~/models/Qwen3-30B-A3B/config.json --seq-length 4096 \\
      --cluster frontier --nodes 8 --global-batch 512
  # a model from a training config, on a cluster described in a YAML file
  megatron-plan search --config examples/local/tiny.yaml --cluster mycluster.yaml --nodes 2
  # the layout a training config sets (its TP, PP, ZeRO, recompute, micro-batch, attention)
  megatron-plan memory --config run.yaml --cluster a100 --nodes 4
  # fit the model to short real runs on this machine (2 ranks), resumable from trials.jsonl
  megatron-plan calibrate --config examples/local/tiny.yaml --nproc 2 --trials 8 \\
      --results trials.jsonl --out local-profile.yaml [--bayes]
  # the longest sequence the 175B trains at on 16 Frontier nodes (context parallelism included)
  megatron-plan longest --model 175b --cluster frontier --nodes 16 [--cp-values 1]
  # weak and strong scaling of the 175B recipe from 16 to 128 nodes, with a plot
  megatron-plan scaling --model 175b --cluster frontier --nodes 16,32,64,128 \\
      --global-batch 1280 --tp 4 --pp 16 --recompute full --plot scaling.png

models: 22b, 175b, 1t (the paper's), gpt3-125m ... gpt3-175b; clusters (--cluster is required
for search, memory and scaling; there is no default), a preset:
  {presets}
(frontier: an MI250X GCD; gh200: 4 x 96 GB H100 a node), or a YAML file, which may name a preset
as its `base` and change only the fields it lists (docs/planner.md)."""
EXAMPLES = EXAMPLES.replace("{presets}", PRESET_NAMES)


def _schedule_list() -> str:
    """The registered pipeline schedules (config/schedules), each with its title."""
    return ", ".join(f"{name} ({schedules.get(name).title})" for name in schedules.names())


def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and job")
    g.add_argument("--model", help="a preset: 22b, 175b, 1t, gpt3-125m ... gpt3-175b; or a "
                   "Hugging Face config.json or model folder (GPT-2, Llama, Qwen2/3, Qwen3-MoE, "
                   "Mixtral, Gemma 3), at --seq-length")
    g.add_argument("--config", help="a training config YAML: its model, batch and precision, "
                   "and for memory and scaling its layout")
    g.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a field of --config (repeatable)")
    g.add_argument("--global-batch", type=count(1, MAX_BATCH),
                   help="sequences per step (default: the config's, or 1280 for presets)")
    g.add_argument("--seq-length", type=count(1, MODEL_LIMITS["seq_length"]),
                   help="sequence length (default 2048 for presets)")
    g.add_argument("--precision", choices=("fp32", "bf16", "fp16"),
                   help="default: the config's, or bf16 for presets")
    g.add_argument("--grad-dtype", choices=GRAD_DTYPES,
                   help="the gradient buffers' and reduction's dtype (default: the engine's; "
                   "bf16 is Megatron-LM's --grad-reduce-in-bf16, NeMo's default; for DeepSpeed "
                   "its communication_data_type)")
    g.add_argument("--fp8", action="store_true",
                   help="price FP8 matrix multiplies in the transformer layers' linear layers "
                   "(Transformer Engine's recipe as Megatron Core and NeMo run it; devices with "
                   f"FP8: {FP8_PRESET_NAMES}); priced only: this trainer has no FP8, so "
                   "search writes no --out-config with it, and calibrate refuses it "
                   "(docs/planner.md, \"FP8\")")
    g.add_argument("--fp8-params", action="store_true",
                   help="with --fp8: the linear weights kept in FP8 too (NeMo's fp8_params, "
                   "Megatron-LM's --fp8-param-gather): 1-byte weights and parameter all-gather")


def _cluster_args(p: argparse.ArgumentParser, nodes: bool = True) -> None:
    g = p.add_argument_group("cluster")
    # Required: a silent default (it was frontier) priced A100 or H100 jobs as MI250X GCDs.
    g.add_argument("--cluster", help=f"required: a preset ({PRESET_NAMES}) "
                   "or a cluster/profile YAML")
    g.add_argument("--framework", choices=FRAMEWORKS,
                   help="the engine whose overlap of communication with compute and whose "
                   "model states to price (default: the cluster file's `framework`, else "
                   "deepspeed, what this trainer runs: DeepSpeed's overlap_comm and the "
                   "backward's column-parallel TP collectives under their weight gradients); "
                   "megatron-deepspeed: DeepSpeed with every TP collective exposed (the "
                   "published Megatron-DeepSpeed runs: MT-NLG, BLOOM, Frontier's); "
                   "megatron-core: --tp-comm-overlap, "
                   "--overlap-grad-reduce and --overlap-param-gather on; megatron-lm: only the "
                   "backward's column-parallel TP collectives under their weight gradients "
                   "(Megatron-LM since Sep 2021); megatron-lm-2021: nothing overlapped; all three "
                   "with Megatron's optimizer (ZeRO-0 or 1 only); fsdp: PyTorch "
                   "FSDP (ZeRO-2 or 3; with TP and PP as Llama 3's stack: ZeRO-2 "
                   "reduce-scatters every micro-batch, sends asynchronous); aa-scaling: "
                   "Aleph Alpha's Scaling (ZeRO-0 or 1, an fp32 gradient all-reduce after the "
                   "backward, nothing overlapped); nanotron: Hugging Face's (ZeRO-0 or 1, fp32 "
                   "gradients reduced under the backward by DDP at ZeRO-0 only, its stages "
                   "split by compute cost); the other seven are comparisons "
                   "(docs/planner.md, "
                   "\"Overlap by framework\"), each offered and accepted only with the "
                   "pipeline schedules and context parallelism it runs")
    if nodes:
        g.add_argument("--nodes", type=count(1, MAX_NODES), default=1,
                       help="node count (default 1)")


def _space_args(p: argparse.ArgumentParser, cp_default: str = "auto",
                ep_default: str = "auto") -> None:
    g = p.add_argument_group("search space (comma-separated lists)")
    g.add_argument("--tp-values", help="tensor-parallel sizes (default: powers of 2 in a node)")
    g.add_argument("--pp-values", help="pipeline sizes (default: divisors of the layer count)")
    g.add_argument("--micro-batches", default="1,2,4,8,16")
    g.add_argument("--zero-stages", default="0,1,2,3")
    g.add_argument("--recompute-values", default="none,selective,full")
    g.add_argument("--flash", choices=("both", "on", "off"), default="both",
                   help="attention path: FlashAttention, the math path, or both")
    g.add_argument("--sequence-parallel", choices=("both", "on", "off"), default="both")
    g.add_argument("--max-tp", type=count(1), help="allow TP beyond one node (for comparison)")
    g.add_argument("--memory-fraction", type=number, default=1.0,
                   help="share of device memory a layout may reserve (default 1.0)")
    g.add_argument("--schedules",
                   help="parallel.pipeline_schedule values tried where PP > 1, among "
                        f"{_schedule_list()}; default: those this trainer runs "
                        f"({','.join(schedules.with_runner())})")
    g.add_argument("--cp-values", default=cp_default,
                   help="context-parallel degrees (parallel.context_parallel_size, Ulysses) to "
                        "try; auto: every divisor of the query heads per TP rank that splits the "
                        f"sequence, inside or across nodes (default {cp_default})")
    g.add_argument("--cp-algos", default="ulysses" if cp_default == "1" else "all",
                   help="context-parallel algorithms to try where CP > 1 (ulysses, ring, "
                        "allgather, hybrid, or all; hybrid with every Ulysses degree it allows)")
    g.add_argument("--interleave-values", default="1", metavar="V,..",
                   help="model chunks per stage to try where PP > 1 (Megatron-LM's interleaved "
                        "1F1B, which this trainer runs as its interleaved schedule, e.g. "
                        "1,2,4; zbv takes exactly 2): proposed where it wins within memory, "
                        "and --out-config writes it; default 1 (plain stages only)")
    g.add_argument("--lighter-ends", default="0", metavar="D,..",
                   help="layers fewer on the first and on the last stage (model chunk) than "
                        "on each one between them, each end taking any of these values apart "
                        "from the other (parallel.pipeline_first/last_stage_layers; Llama 3 "
                        "405B's 126 layers on 16 stages as 7, 8 x 14, 7 is 1 at both ends; a "
                        "large vocabulary's logits may want the last alone lighter), e.g. "
                        "0,1,2: proposed where it wins within memory; with 1, also the "
                        "embedding and head counted as a layer where that leaves an end chunk "
                        "none (parallel.pipeline_embedding_as_layer, Llama 3 405B's 8 "
                        "one-layer chunks a stage); default 0 (the even split only)")
    g.add_argument("--ep-values", default=ep_default,
                   help="expert-parallel sizes (parallel.expert_parallel_size) to try for a "
                        "mixture-of-experts model; auto: every divisor of num_experts that "
                        f"divides DP (default {ep_default}; 1 for a dense model)")


def _layout_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layout (default: what --config FILE sets, else TP 1, PP 1, "
                             "CP 1, micro-batch 1, ZeRO 1, no recompute, flash, no SP, "
                             f"{schedules.DEFAULT}; a flag given here overrides the config)")
    g.add_argument("--tp", type=count(1))
    g.add_argument("--pp", type=count(1))
    g.add_argument("--micro-batch", type=count(1))
    g.add_argument("--zero", type=integer, choices=(0, 1, 2, 3))
    g.add_argument("--recompute", choices=("none", "selective", "full"))
    g.add_argument("--flash", dest="flash", action="store_const", const=True, default=None,
                   help="the FlashAttention path")
    g.add_argument("--no-flash", dest="flash", action="store_const", const=False,
                   help="the math attention path")
    g.add_argument("--sp", dest="sp", action="store_const", const=True, default=None,
                   help="sequence parallelism")
    g.add_argument("--no-sp", dest="sp", action="store_const", const=False,
                   help="no sequence parallelism")
    g.add_argument("--schedule", choices=schedules.names(),
                   help=f"parallel.pipeline_schedule: {_schedule_list()} (default: the "
                        f"config's, else {schedules.DEFAULT}); each has its own rule (zbh1 "
                        "needs --pp > 1)")
    g.add_argument("--cp", type=count(1), help="parallel.context_parallel_size (default: the "
                   "config's, else 1): each rank holds 1/CP of every sequence (Ulysses)")
    g.add_argument("--cp-algo", choices=("ulysses", "ring", "allgather", "hybrid"),
                   help="parallel.context_parallel_algo (default: the config's, else ulysses)")
    g.add_argument("--ulysses-degree", type=count(0), metavar="U",
                   help="parallel.ulysses_degree: Ulysses ranks of a hybrid group")
    g.add_argument("--ep", type=count(1), help="parallel.expert_parallel_size (default: the "
                   "config's, else 1): each rank holds num_experts / EP experts (docs/moe.md)")
    g.add_argument("--first-stage-layers", type=count(1), metavar="N",
                   help="transformer layers on the first stage (Megatron-LM's "
                        "--decoder-first-pipeline-num-layers, this trainer's "
                        "parallel.pipeline_first_stage_layers; the other stages share the rest "
                        "evenly)")
    g.add_argument("--last-stage-layers", type=count(1), metavar="N",
                   help="transformer layers on the last stage (--decoder-last-pipeline-num-"
                        "layers, parallel.pipeline_last_stage_layers)")
    g.add_argument("--embedding-as-layer", action="store_true", default=None,
                   help="count the embedding as one transformer layer in the even split over "
                        "the stages (or model chunks): the first holds one layer fewer, none "
                        "when each holds one (Megatron Core's --account-for-embedding-in-"
                        "pipeline-split, parallel.pipeline_embedding_as_layer)")
    g.add_argument("--loss-as-layer", action="store_true", default=None,
                   help="count the output layer and loss as one transformer layer likewise: "
                        "the last stage or chunk holds one fewer (--account-for-loss-in-"
                        "pipeline-split, parallel.pipeline_loss_as_layer)")
    g.add_argument("--interleave", type=count(1), metavar="V",
                   help="V model chunks per stage (parallel.virtual_pipeline_size): "
                        "Megatron-LM's interleaved 1F1B (this trainer's interleaved "
                        "schedule), or 2 with --schedule zbv")
    g.add_argument("--microbatch-group", type=count(0), metavar="N",
                   help="under the interleaved schedule, the micro-batches a model chunk "
                        "takes in a row (parallel.pipeline_microbatch_group, Megatron Core's "
                        "--microbatch-group-size-per-virtual-pipeline-stage; default the "
                        "stages): lets the micro-batches be other than a multiple of --pp, "
                        "for (V - 1)(N - PP) more chunk activations held")


def _add_search(sub, fmt) -> None:
    s = sub.add_parser("search", help="rank every layout that fits", epilog=EXAMPLES,
                       formatter_class=fmt)
    _model_args(s)
    _cluster_args(s)
    _space_args(s)
    s.add_argument("--top", type=count(1), default=15, help="rows to print (default 15)")
    s.add_argument("--out-config", help="write the best layout as a training config YAML")
    s.add_argument("--out-sbatch", help="write a Slurm batch script that runs --out-config")
    s.add_argument("--run-dir", help="run.dir of the written config")


def _add_calibrate(sub, fmt) -> None:
    c = sub.add_parser("calibrate", help="fit the model to real trials on this machine",
                       epilog=EXAMPLES, formatter_class=fmt)
    _model_args(c)
    _space_args(c, cp_default="1", ep_default="1")
    c.add_argument("--nproc", type=count(1), default=2, help="ranks per trial (default 2)")
    c.add_argument("--trials", type=count(0), default=8, help="new trials to run (default 8)")
    c.add_argument("--results", default="plan-trials.jsonl",
                   help="trial results (JSON lines); existing ones are reused (resume)")
    c.add_argument("--out", default="plan-profile.yaml", help="the fitted cluster profile")
    c.add_argument("--cluster", help="base profile to refine (default: probe this machine)")
    c.add_argument("--bayes", action="store_true", help="Bayesian optimisation (Optuna TPE) "
                   "instead of a spread of predicted layouts")
    c.add_argument("--steps", type=count(1), default=6,
                   help="training steps per trial (default 6)")
    c.add_argument("--warmup", type=count(0), default=2,
                   help="steps left out of timing (default 2; fewer than --steps)")
    c.add_argument("--timeout", type=positive_seconds, default=600,
                   help="seconds per trial (default 600)")
    c.add_argument("--run-root", default="runs/plan-trials",
                   help="run directories of trials (and agent-logs/, torchrun's)")
    c.add_argument("--flash-backend", default=variants.AUTO, type=_attention_core,
                   help="attention_backend for flash layouts (default auto: the model picks "
                        "the first core the device runs, flash on GPUs, sdpa on CPU)")
    c.add_argument("--fit-only", action="store_true", help="fit stored results, run nothing")


def _attention_core(text: str) -> str:
    """--flash-backend: a registered attention core (plugins' included: they load before the
    command line is parsed) or auto, checked before anything is probed or run."""
    known = variants.choices("attention")
    if text not in known:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: expected one of "
                                         f"{', '.join(known)}")
    return text


def _add_longest(sub, fmt) -> None:
    g = sub.add_parser("longest", help="the longest sequence that fits, and its layout",
                       epilog=EXAMPLES, formatter_class=fmt)
    _model_args(g)
    _cluster_args(g)
    g.add_argument("--cp-values", default="auto",
                   help="context-parallel degrees to try (default auto: every divisor of the "
                        "query heads per TP rank, and past it for ring, allgather and hybrid; "
                        "1: without context parallelism)")
    g.add_argument("--cp-algos", default="all",
                   help="context-parallel algorithms to try (default all: ulysses, ring, "
                        "allgather, hybrid)")
    g.add_argument("--memory-fraction", type=number, default=1.0,
                   help="share of device memory a layout may reserve (default 1.0)")
    g.add_argument("--step", type=count(1, MODEL_LIMITS["seq_length"]), default=1024,
                   help="lengths tried are multiples of this (default 1024)")
    g.add_argument("--top", type=count(1), default=5, help="fitting layouts to print (default 5)")


def _add_scaling(sub, fmt) -> None:
    g = sub.add_parser("scaling", help="weak and strong scaling over node counts",
                       epilog=EXAMPLES, formatter_class=fmt)
    _model_args(g)
    _cluster_args(g, nodes=False)
    _layout_args(g)
    g.add_argument("--nodes", required=True, help="node counts, e.g. 16,32,64,128")
    g.add_argument("--mode", choices=("weak", "strong", "both"), default="both")
    g.add_argument("--plot", help="write a plot here: a file ending in .png, .pdf or .svg")
    g.add_argument("--best", action="store_true",
                   help="use the best layout found at the smallest node count (no layout "
                        "flags beside it)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="megatron-plan", description=__doc__, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    fmt = argparse.RawDescriptionHelpFormatter
    _add_search(sub, fmt)
    m = sub.add_parser("memory", help="memory and time of one layout, and where its step goes",
                       epilog=EXAMPLES, formatter_class=fmt)
    _model_args(m)
    _cluster_args(m)
    _layout_args(m)
    _add_calibrate(sub, fmt)
    _add_scaling(sub, fmt)
    _add_longest(sub, fmt)
    return parser


@entry_point("megatron-plan")
def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # the long flags the command line gave (plan_commands: what search says it left out)
    args.given_flags = list(dict.fromkeys(a.split("=")[0] for a in (
        sys.argv[1:] if argv is None else argv) if a.startswith("--")))
    if not args.command:  # the usage and one error line on stderr, as any other refusal
        parser.error("name a command: search, memory, longest, scaling or calibrate "
                     "(megatron-plan --help says what each does)")
    level = logging.INFO if args.verbose or args.command == "calibrate" else logging.WARNING
    logging.basicConfig(level=level, format="megatron-plan: %(message)s")
    from megatron.cli import plan_commands  # after parsing: --help stays instant
    return plan_commands.COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
