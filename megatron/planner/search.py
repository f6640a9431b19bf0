"""Enumerate 3D layouts, predict each one's memory and step time, rank those that fit."""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple

from megatron.config import schedules
from megatron.config.errors import ConfigError, InputError
from megatron.config.interleaving import INTERLEAVED, fitting_group
from megatron.config.stages import accounted_problem
from megatron.planner.layout import (RECOMPUTE, Job, Layout, engine_run_problem,
                                     engine_stage_counts, layout_problem)
from megatron.planner.memory import GIB, StageMemory, engine_problem, peak_memory
from megatron.planner.overlap import DEEPSPEED, OVERLAP, Refusal
from megatron.planner.problem import problem_key
from megatron.planner.profile import Profile
from megatron.planner.timing import TimeEstimate, step_time

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchSpace:
    """What the search may vary; None means every value the cluster and model allow."""
    tp: Optional[Sequence[int]] = None
    pp: Optional[Sequence[int]] = None
    micro_batch: Sequence[int] = (1, 2, 4, 8, 16)
    zero: Sequence[int] = (0, 1, 2, 3)
    recompute: Sequence[str] = RECOMPUTE
    flash: Sequence[bool] = (True, False)
    sequence_parallel: Sequence[bool] = (False, True)
    # parallel.pipeline_schedule values tried where PP > 1 (a single stage runs the default);
    # by default every registered schedule the trainer can run (a record with a runner)
    schedules: Sequence[str] = field(default_factory=schedules.with_runner)
    # TP is kept inside a node unless this allows more (to test that lesson, not to use it).
    max_tp: Optional[int] = None
    uneven_pp: bool = False
    # Context-parallel degrees (parallel.context_parallel_size); None: every divisor of the
    # query heads per TP rank that splits the sequence (a group of tp x cp beyond a node
    # exchanges over the NICs, priced so). The library's default leaves it out (what
    # calibration and validation enumerate); megatron-plan search and longest explore it.
    cp: Optional[Sequence[int]] = (1,)
    # Expert-parallel sizes (parallel.expert_parallel_size) for a MoE model; None: every
    # divisor of num_experts that divides DP (a dense model: 1 only).
    ep: Optional[Sequence[int]] = (1,)
    # parallel.context_parallel_algo values tried where CP > 1 (hybrid with every Ulysses
    # degree it allows); the library's default prices Ulysses only.
    cp_algos: Sequence[str] = ("ulysses",)
    # Model chunks per stage tried where PP > 1 (Megatron-LM's interleaved 1F1B, which the
    # trainer runs as its interleaved schedule; layout.chunks_note); the default prices plain only.
    interleave: Sequence[int] = (1,)
    # Layers fewer on the first and on the last model chunk than on each chunk between them,
    # each end taking its own value of these (end_splits; parallel.pipeline_first/last_stage_
    # layers, what recipes do to make room for the embedding and the logits: Llama 3 405B's
    # 126 layers on 16 stages as 7, 8 x 14, 7 is 1 at both ends; a large vocabulary's logits
    # may call for a lighter last stage alone); 0: as the middle. The default prices even
    # splits only.
    lighter_ends: Sequence[int] = (0,)
    # A layout fits when its reserved memory is at most this share of device memory.
    memory_fraction: float = 1.0


@dataclass(frozen=True)
class Candidate:
    layout: Layout
    memory: StageMemory
    time: Optional[TimeEstimate]
    fits: bool


@dataclass
class SearchResult:
    job: Job
    nodes: int
    world: int
    ranked: List[Candidate]
    enumerated: int = 0
    rejected: Counter = field(default_factory=Counter)
    # layouts of the space left out because the engine (--framework) does not run them, by
    # what it does not run (enumerate_layouts' `unrunnable`)
    unrunnable: Counter = field(default_factory=Counter)
    # combinations of the space that make no layout of `world` devices at all, by why
    # (enumerate_layouts' `skipped`): what an empty search says when nothing was enumerated
    skipped: Counter = field(default_factory=Counter)
    framework: str = "deepspeed"
    memory_fraction: float = 1.0  # the share of device memory a layout may reserve

    @property
    def best(self) -> Candidate:
        if not self.ranked:
            raise InputError(self.explain_empty())
        return self.ranked[0]

    def unrunnable_note(self) -> str:
        """One line naming what the search space asked for that the engine does not run, or
        ""."""
        if not self.unrunnable:
            return ""
        return (f"left out, as framework {self.framework} does not run them: "
                f"{_unrunnable_list(self.unrunnable)}")

    def explain_empty(self) -> str:
        if not self.enumerated and self.unrunnable:
            return unrunnable_message(self.world, self.framework, self.unrunnable)
        if not self.enumerated and self.skipped:
            why = "; ".join(f"{reason} ({n}x)" if n > 1 else reason
                            for reason, n in self.skipped.most_common(3))
            return (f"no combination of the search space is a layout of {self.world} devices "
                    f"for this model and batch: {why}; widen --tp-values, --pp-values, "
                    "--micro-batches, --cp-values or --ep-values to sizes that divide, or "
                    "change --global-batch or --nodes")
        reasons = ", ".join(f"{n} {why}" for why, n in self.rejected.most_common(3))
        share = (f", or raise --memory-fraction (now {self.memory_fraction:g})"
                 if self.rejected[_over_memory(self.memory_fraction)] and
                 self.memory_fraction < 1 else "")
        return (f"no layout of {self.world} devices fits this model and batch "
                f"({self.enumerated} enumerated: {reasons or 'none valid'}); add nodes, lower "
                f"the micro-batch or allow recompute and ZeRO{share}")


def _listed(values) -> str:
    return ",".join(map(str, values)) if values is not None else "the default sizes"


def _over_memory(fraction: float) -> str:
    """The summary's key for layouts that reserve more than the share allowed them."""
    return "exceed device memory" if fraction == 1 else f"exceed {fraction:g} of device memory"


def _unrunnable_list(unrunnable: Counter) -> str:
    return ", ".join(f"{why} ({n} layout{'s' if n > 1 else ''})"
                     for why, n in unrunnable.most_common())


def unrunnable_message(world: int, framework: str, unrunnable: Counter) -> str:
    """Why a search space holds no layout at all: the engine runs none of what it asks for
    (enumerate_layouts' `unrunnable`), and the flags that widen it."""
    return (f"no layout of {world} devices in the search space runs under framework "
            f"{framework}: {_unrunnable_list(unrunnable)}; widen the space (--zero-stages, "
            "--schedules, --recompute-values, --cp-values, --cp-algos, --interleave-values) to "
            "what it runs, or pick another --framework (docs/planner.md, \"What each engine "
            "runs\")")


def _powers_of_two_dividing(n: int, limit: int) -> List[int]:
    out, v = [], 1
    while v <= min(n, limit):
        if n % v == 0:
            out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(job: Job, world: int, gpus_per_node: int, space: SearchSpace,
                      framework: str = "deepspeed",
                      unrunnable: Optional[Counter] = None,
                      skipped: Optional[Counter] = None) -> Iterator[Layout]:
    """The layouts of `world` devices the space allows and the engine `framework` can run
    (memory.engine_problem, layout.engine_run_problem); those it cannot, counted in
    `unrunnable` by what it does not run, and the combinations that make no layout, in
    `skipped` by why, where given."""
    skipped = skipped if skipped is not None else Counter()
    max_tp = space.max_tp or gpus_per_node
    tps = space.tp or _powers_of_two_dividing(world, max_tp)
    own_split = framework in OVERLAP and OVERLAP[framework].cost_split  # any PP: its own split
    for tp in tps:
        if world % tp:
            skipped[f"TP {tp} does not divide the {world} devices"] += 1
            continue
        pps = space.pp or [p for p in _divisors(world // tp) if p <= job.model.num_layers and
                           (space.uneven_pp or own_split or job.model.num_layers % p == 0 or
                            any(end_splits(job.model.num_layers, p * v, space.lighter_ends)
                                or counted_splits(job.model.num_layers, p, v,
                                                  space.lighter_ends)
                                for v in space.interleave))]
        for pp in pps:
            if (world // tp) % pp:
                skipped[f"PP {pp} does not divide the {world // tp} devices TP {tp} "
                        "leaves"] += 1
                continue
            degrees = _cp_degrees(job, tp, world // (tp * pp), space)
            if not degrees:
                skipped[f"no context-parallel degree of {_listed(space.cp)} divides the "
                        f"{world // (tp * pp)} devices TP {tp} x PP {pp} leave"] += 1
            for cp in degrees:
                yield from _inner_layouts(job, tp, pp, world // (tp * pp * cp), space, cp,
                                          framework, unrunnable, skipped)


Ends = Tuple[Optional[int], Optional[int]]


def end_splits(num_layers: int, chunks: int, lighter: Sequence[int]) -> List[Ends]:
    """(first, last) model-chunk layer counts where the first chunk holds d_first and the last
    d_last layers fewer than each chunk between them, for every pair of `lighter` values, the
    two ends chosen apart (the first chunk carries the embedding, the last the logits and the
    loss: not the same weight). None on a side: that chunk holds as many as the middle ones (the
    trainer's unset count). The even split (0, 0) is not listed; a pair is left out where the
    layers do not split so: d_first + d_last + num_layers = chunks x middle, every chunk at
    least one layer. With two chunks only the unequal pairs (no chunk lies between them)."""
    out: List[Ends] = []
    if chunks < 2:
        return out
    for d_first in lighter:
        for d_last in lighter:
            if d_first < 0 or d_last < 0 or (d_first == d_last and (d_first == 0 or chunks == 2)):
                continue
            mid, r = divmod(num_layers + d_first + d_last, chunks)
            if r or mid - max(d_first, d_last) < 1:
                continue
            ends = (mid - d_first if d_first else None, mid - d_last if d_last else None)
            if ends not in out:
                out.append(ends)
    return out


def counted_splits(num_layers: int, pp: int, chunks: int, lighter: Sequence[int]
                   ) -> List[Tuple[bool, bool]]:
    """(embedding, loss) counted as a layer (config/stages.accounted_ends) where that leaves an
    end chunk with no layer, which set counts cannot say (end_splits keeps a layer in each):
    with 1 among the `lighter` values, every split of one layer a chunk the trainer runs."""
    if 1 not in lighter or pp < 2:
        return []
    out = []
    for emb, loss in ((True, True), (True, False), (False, True)):
        if (num_layers + emb + loss == pp * chunks
                and not accounted_problem(num_layers, pp, chunks, emb, loss)):
            out.append((emb, loss))
    return out


Split = Tuple[Optional[int], Optional[int], bool, bool, Tuple[int, ...]]


def _stage_splits(job: Job, pp: int, v: int, space: SearchSpace,
                  framework: str = "deepspeed") -> List[Split]:
    """(first, last, embedding counted, loss counted, the engine's own counts) to try: an
    engine that splits by a compute cost (Overlap.cost_split) its split alone; else
    (None, None, False, False, ()) is the even split, where the layers allow it, the engine
    splits them itself, space.uneven_pp, or the stage counts were given; then the set end
    counts (end_splits) and the ends counted as a layer where that empties an end chunk
    (counted_splits)."""
    if pp == 1:
        return [(None, None, False, False, ())]
    counts = engine_stage_counts(job.model, pp, framework)
    if counts:
        return [(None, None, False, False, counts)] if v == 1 else []
    out: List[Split] = []
    if 0 in space.lighter_ends and (job.model.num_layers % pp == 0 or space.uneven_pp or
                                    space.pp is not None):
        out.append((None, None, False, False, ()))
    out += [(first, last, False, False, ())
            for first, last in end_splits(job.model.num_layers, pp * v, space.lighter_ends)]
    return out + [(None, None, emb, loss, ()) for emb, loss in
                  counted_splits(job.model.num_layers, pp, v, space.lighter_ends)]


def _cp_degrees(job: Job, tp: int, rest: int, space: SearchSpace) -> List[int]:
    """Context-parallel degrees to try beside TP x PP: those that divide the remaining ranks;
    by default the divisors of the query heads per TP rank that split the sequence
    (config/validate.context_parallel_error's rules)."""
    if space.cp is not None:
        return [c for c in space.cp if c >= 1 and rest % c == 0]
    m = job.model
    heads = m.num_attention_heads // tp
    if tuple(space.cp_algos) == ("ulysses",):
        return [c for c in _divisors(heads) if rest % c == 0 and m.seq_length % c == 0]
    # the ring part has no head cap: every degree that splits the sequence in 2C chunks
    return [c for c in _divisors(rest) if m.seq_length % c == 0 and
            (heads % c == 0 or m.seq_length % (2 * c) == 0)]


def _cp_variants(cp: int, space: SearchSpace) -> List[Tuple[str, int]]:
    """(context_parallel_algo, ulysses_degree) pairs to try at CP degree cp."""
    if cp == 1:
        return [("ulysses", 0)]
    out = []
    for algo in space.cp_algos:
        if algo == "hybrid":
            out += [("hybrid", u) for u in _divisors(cp) if 2 <= u <= cp // 2]
        else:
            out.append((algo, 0))
    return out


def _ep_sizes(job: Job, tp: int, dp: int, cp: int, space: SearchSpace,
              framework: str = "deepspeed") -> List[int]:
    """Expert-parallel sizes to try: the space's, else every divisor of num_experts that
    divides the ranks EP is folded from (experts.expert_dp: a stage's tp x dp x cp here, with
    tensor-parallel ranks first; dp x cp under engines that split experts over TP), so EP may
    exceed DP here. 1 for a dense model, which refuses a space of expert-parallel sizes
    without 1 rather than search other sizes than asked."""
    if not job.model.moe.num_experts:
        if space.ep is not None and 1 not in space.ep:
            raise ConfigError("--ep-values", ",".join(map(str, space.ep)),
                              "1 for a dense model (model.moe.num_experts is 0: no experts to "
                              "split)", "leave --ep-values out, or plan a model with experts")
        return [1]
    ov = OVERLAP.get(framework)
    ranks = dp * cp * (1 if ov is not None and ov.expert_tp else tp)
    sizes = space.ep if space.ep is not None else _divisors(job.model.moe.num_experts)
    return [e for e in sizes if ranks % e == 0 and job.model.moe.num_experts % e == 0]


def _schedule_variants(pp: int, cp: int, space: SearchSpace) -> List[Tuple[str, int]]:
    """(schedule, chunks per stage) pairs to try: one stage runs the default, plainly; else
    the space's schedules, each with the chunk counts its record's rule accepts (zbh1 with CP
    or interleaved is refused, as the trainer and Megatron-LM refuse them), a chunked 1f1b
    not beside the interleaved schedule it runs as."""
    if pp == 1:
        return [(schedules.DEFAULT, 1)]
    # a record whose chunked form the space also names runs as that one with chunks (1f1b
    # with v > 1 is the interleaved schedule, layout.run_as): listed once, under that name
    return [(name, v) for name in space.schedules for v in space.interleave
            if v >= 1 and not schedules.get(name).rule(pp, cp, v)
            and not (v > 1 and schedules.get(name).chunked in space.schedules)]


def _group(schedule: str, pp: int, v: int, micro_batches: int) -> int:
    """parallel.pipeline_microbatch_group for the interleaved order where pp does not divide
    the micro-batches: the smallest group that takes them (the least warm-up memory;
    config/interleaving.fitting_group), else 0 (the default, pp)."""
    if v == 1 or micro_batches % pp == 0:
        return 0
    record = schedules.get(schedule)  # 1f1b with chunks runs as the interleaved schedule
    if schedules.get(record.chunked or schedule).runner != INTERLEAVED:
        return 0
    return fitting_group(pp, micro_batches)


def _inner_layouts(job: Job, tp: int, pp: int, dp: int, space: SearchSpace,
                   cp: int = 1, framework: str = "deepspeed",
                   unrunnable: Optional[Counter] = None,
                   skipped: Optional[Counter] = None) -> Iterator[Layout]:
    left_out = unrunnable if unrunnable is not None else Counter()
    skipped = skipped if skipped is not None else Counter()
    eps = _ep_sizes(job, tp, dp, cp, space, framework)
    if not eps:
        skipped[f"no expert-parallel size of {_listed(space.ep)} divides the ranks TP {tp} x "
                f"DP {dp} x CP {cp} fold it from and the {job.model.moe.num_experts} "
                "experts"] += 1
    for mb in space.micro_batch:
        if job.global_batch % (mb * dp):
            skipped[f"the global batch {job.global_batch} is not a multiple of micro-batch "
                    f"{mb} x DP {dp}"] += 1
            continue
        ga = job.global_batch // (mb * dp)
        # every combination of the other axes, the same for each ZeRO stage
        combos = [(rc, flash, sp, schedule, v, ends, ep, algo, u)
                  for rc in space.recompute for flash in space.flash
                  for sp in space.sequence_parallel if not (sp and tp == 1)
                  for schedule, v in _schedule_variants(pp, cp, space)
                  for ends in _stage_splits(job, pp, v, space, framework)
                  for ep in eps
                  for algo, u in _cp_variants(cp, space)]
        for zero in space.zero:
            # what the engine refuses of the ZeRO stage drops every layout at it
            zero_problem = (Refusal(f"--zero {zero} with a pipeline under framework {framework}: "
                                    "DeepSpeed's pipeline engine runs ZeRO-0 or 1",
                                    key=f"--zero {zero} with a pipeline")
                            if pp > 1 and zero > 1 and framework in DEEPSPEED else
                            engine_problem(framework, zero))
            if zero_problem:
                if combos:
                    left_out[zero_problem.key] += len(combos)
                continue
            for rc, flash, sp, schedule, v, ends, ep, algo, u in combos:
                lay = Layout(tp, pp, dp, mb, ga, zero, rc, flash, sp, v, schedule, cp=cp,
                             first_stage_layers=ends[0], last_stage_layers=ends[1], ep=ep,
                             embedding_as_layer=ends[2], loss_as_layer=ends[3],
                             stage_counts=ends[4],
                             cp_algo=algo, ulysses_degree=u,
                             microbatch_group=_group(schedule, pp, v, ga))
                problem = engine_run_problem(framework, lay, job.model)
                if problem:
                    left_out[problem.key] += 1
                else:
                    yield lay


def evaluate(job: Job, lay: Layout, prof: Profile, space: SearchSpace = SearchSpace(),
             with_time: bool = True) -> Candidate:
    mem = peak_memory(job, lay, prof.constants, framework=prof.spec.framework)
    fits = mem.reserved_bytes <= prof.spec.gpu_memory_gb * GIB * space.memory_fraction
    est = step_time(job, lay, prof) if (fits or with_time) else None
    return Candidate(lay, mem, est, fits)


def rank_key(c: Candidate):
    """Fastest first; among equals (to 4 digits) the least memory, then ZeRO-1 (bf16 under the
    pipeline engine takes the same BF16 optimizer path at ZeRO-0 and ZeRO-1; ZeRO-1 is the
    paper's choice and the one DeepSpeed tests most), then the fewer features switched on
    (the schedules in registration order, the default first: 1f1b before zbh1, which is
    proposed only where it predicts a faster step or less memory; the even split before
    lighter end stages)."""
    lay = c.layout
    speed = float(f"{c.time.tokens_per_s:.4g}")
    return (-speed, round(c.memory.peak_bytes / GIB, 1), lay.zero != 1,
            RECOMPUTE.index(lay.recompute), not lay.flash, lay.sequence_parallel,
            schedules.names().index(lay.schedule), lay.interleave, lay.uneven, lay.cp, lay.ep,
            ("ulysses", "allgather", "ring", "hybrid").index(lay.cp_algo), lay.ulysses_degree)


def search(job: Job, nodes: int, prof: Profile,
           space: Optional[SearchSpace] = None) -> SearchResult:
    """Every valid layout of nodes x gpus_per_node devices, the fitting ones ranked fastest
    first (ties: less memory). space None: SearchSpace() as the registry stands at the call."""
    space = space or SearchSpace()
    world = nodes * prof.spec.gpus_per_node
    result = SearchResult(job, nodes, world, [], framework=prof.spec.framework,
                          memory_fraction=space.memory_fraction)
    for lay in enumerate_layouts(job, world, prof.spec.gpus_per_node, space,
                                 prof.spec.framework, result.unrunnable, result.skipped):
        result.enumerated += 1
        problem = layout_problem(job, lay, prof.spec.framework)
        if problem:
            result.rejected[problem_key(problem)] += 1
            continue
        cand = evaluate(job, lay, prof, space, with_time=False)
        if not cand.fits:
            result.rejected[_over_memory(space.memory_fraction)] += 1
            continue
        result.ranked.append(cand)
    result.ranked.sort(key=rank_key)
    log.info("searched %d layouts of %d devices: %d fit", result.enumerated, world,
             len(result.ranked))
    return result
