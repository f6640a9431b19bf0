"""Memory per device: model states by precision and ZeRO stage, activations as the pipeline
schedule's record keeps them (config/schedules: 1F1B, ZB-H1).

Model states follow what DeepSpeed 0.19 allocates for the config this project generates
(megatron/base/deepspeed_json.py: a torch Adam, contiguous_gradients, and the bucket and
overlap settings zero_settings.py reads from the same function that writes deepspeed.json):
- ZeRO 1-3 (DeepSpeedZeroOptimizer / stage 3): an fp32 master partition (a copy even for fp32
  models) and fp32 Adam moments, both 1/dp; gradients in the model dtype, whole for ZeRO-1, a
  1/dp partition for ZeRO-2/3, plus the contiguous buckets of reduce_bucket_size elements: two
  for ZeRO-1/2 with overlap_comm (the GPU default without pipelining), else one; ZeRO-3's in
  the communication dtype (on a CPU, where only touched pages are resident, just what ZeRO-3
  copies through it).
- ZeRO-0: fp32 uses the torch optimizer as is (no master copy); fp16, and bf16 without
  pipelining, use the FP16 optimizer (whole fp32 master and moments); bf16 with pipelining uses
  DeepSpeed's BF16 optimizer, which shards master and moments over DP like ZeRO-1.
  Under context parallelism "DP" here is dp x cp (Layout.zero_dp): DeepSpeed's data-parallel
  group is the dp x cp group (megatron/engine/mpu.py), so its partitions are 1/(dp x cp).
The peak is the larger of two phases: backward (states + activations in flight + one layer's
working set) and the optimizer step (states + the fp32 gradient partition it flattens).

The other engines the planner prices for comparison (overlap.FRAMEWORKS) hold other states:
- megatron-lm / megatron-lm-2021 / megatron-core: Megatron-LM's bytes per parameter (docs/source/
  distrib_optimizer.md): ZeRO-0 is its non-distributed optimizer (20 with fp16 gradients, 18
  with fp32 ones, 16 in fp32), ZeRO-1 its distributed optimizer (4 + 16/d, 6 + 12/d, 8 + 8/d).
  bf16 accumulates and reduces gradients in fp32 (megatron/training/arguments.py forces
  accumulate_allreduce_grads_in_fp32), fp16 keeps them in fp16. The gradients live in the
  contiguous grad buffer, which is also what it communicates: no separate bucket. It has no
  ZeRO-2 or 3.
- fsdp (PyTorch FSDP as llm-foundry runs it, mosaic23): the sharded FlatParameter keeps the
  model's fp32 weights, its gradient is reduced into an fp32 shard, AdamW's moments are fp32:
  16/d bytes a parameter. FULL_SHARD (ZeRO-3 here) gathers the bf16 weights of one wrapped
  block at a time plus the one limit_all_gathers lets it prefetch, and the root unit's (the
  embeddings and final norm, not resharded after the forward); SHARD_GRAD_OP (ZeRO-2) keeps
  the whole bf16 model gathered from the forward to the end of the backward. No pipelining."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional

from megatron.config import schedules
from megatron.config.errors import InputError
from megatron.base.deepspeed_json import DEEPSPEED_REUSE_DISTANCE
from megatron.base.optimizer_kind import optimizer_kind
from megatron.planner import activations as act, experts, fp8
from megatron.planner.grad_dtype import grad_dtype_problem, megatron_precision
from megatron.planner.layout import Job, Layout, layout_stage_layers
from megatron.planner.overlap import DEEPSPEED, MEGATRON, OVERLAP, Refusal
from megatron.planner.params import (StageParams, all_stage_params, expert_params, padded_vocab,
                                     stage_params)
from megatron.planner.profile import Constants
from megatron.planner.zero_settings import bucket_buffers, comm_bytes, profile_settings

GIB = float(2 ** 30)


@dataclass(frozen=True)
class StateBytes:
    weights: float
    grads: float
    optimizer: float        # master copy + Adam moments
    step_transient: float   # what the optimizer step adds (flattened fp32 gradient partition)
    bucket: float           # DeepSpeed's contiguous gradient bucket
    bucket_in_backward: bool
    # the gradients ZeRO-1 keeps at the step (its partitions); None: grads / (dp x cp)
    grads_partition: Optional[float] = None


def zero3_gathered_elems(n: int, layer_params: int,
                         reuse_distance: float = DEEPSPEED_REUSE_DISTANCE) -> float:
    """Elements ZeRO-3 holds gathered whole at the backward peak, besides its partition. Once the
    trace is recorded (from the second step on) DeepSpeed releases a parameter only if it does
    not recur within stage3_max_reuse_distance elements (1e9 unless the deepspeed section sets
    it); backward revisits the forward's modules in reverse, so up to that distance of the stage
    stays gathered from forward into backward, plus the layer in use and the one being
    prefetched. At the default, a stage under 1e9 parameters per rank therefore holds all its
    weights whole."""
    return min(float(n), reuse_distance + 2 * layer_params)


def state_bytes(n: int, layer_params: int, precision: str, zero: int, pp: int, dp: int,
                bucket_elems: float, bucket_touched: bool = False, *, buffers: int = 1,
                bucket_dtype_bytes: Optional[float] = None,
                reuse_distance: float = DEEPSPEED_REUSE_DISTANCE,
                grad_accum: str = "model") -> StateBytes:
    """Bytes of weights, gradients and optimizer states one rank holds for its n parameters.
    buffers: contiguous buckets of bucket_elems (zero_settings.bucket_buffers);
    bucket_dtype_bytes: ZeRO-3's bucket element size (its communication dtype; default the
    model's); bucket_touched: count only the bucket pages gradients write
    (Constants.bucket_touched); grad_accum: training.grad_accum_dtype."""
    lp = act.act_bytes(precision)
    kind = optimizer_kind(precision, zero, pp, grad_accum)
    if kind == "torch":
        return StateBytes(4 * n, 4 * n, 8 * n, 0, 0, False)
    if kind == "fp16":
        return StateBytes(lp * n, lp * n, 12 * n, 4 * n, 0, False)
    if kind == "bf16" and zero == 1:
        # fp32 accumulation (training.grad_accum_dtype): BF16_Optimizer's fp32 buffer of every
        # gradient, unsharded, and lp a parameter more for what its reduction and clipping hold
        # at the peak (its hooks free each bf16 gradient as it lands). Measured on the CPU
        # (tests/integration/test_planner_measured_peak.py): 0.88 predicted/measured, as bf16
        # under ZeRO-1's optimizer (0.89); on an H200 before the hooks freed them, 0.95.
        return StateBytes(lp * n, (lp + 4) * n, 12 * n / dp, 4 * n / dp, 0, False)
    if kind == "bf16":
        return StateBytes(lp * n, lp * n, 12 * n / dp, 4 * n / dp, 0, False)
    # ZeRO-1/2 buckets hold gradients in the model dtype; ZeRO-3's one per communication dtype.
    elem = (bucket_dtype_bytes or lp) if zero == 3 else lp
    bucket = buffers * bucket_elems * elem
    if bucket_touched:
        bucket = elem * min(bucket_elems, float(n)) if zero == 3 and buffers else 0.0
    weights = lp * n / dp if zero == 3 else lp * n
    if zero == 3:
        weights += lp * zero3_gathered_elems(n, layer_params, reuse_distance)
    grads = lp * n if zero == 1 else lp * n / dp
    # ZeRO-1 under the pipeline engine allocates its bucket in reduce_gradients, after the last
    # micro-batch; otherwise the bucket exists from the first backward on.
    in_backward = not (zero == 1 and pp > 1)
    return StateBytes(weights, grads, 12 * n / dp, (4 + lp) * n / dp, bucket, in_backward)


def engine_problem(framework: str, zero: int) -> Optional[Refusal]:
    """Why the engine `framework` cannot run this ZeRO stage (one line naming the flag and the
    fix), or None: Megatron-LM's optimizer is ZeRO-0 or 1 (the distributed optimizer); FSDP
    shards at ZeRO-2 or 3, with or without a pipeline; Aleph Alpha's Scaling (aa-scaling)
    shards the optimizer or nothing; DeepSpeed runs all four (its pipeline engine's ZeRO-0/1
    rule is layout.layout_problem's)."""
    if framework in MEGATRON and zero > 1:
        why = ("Megatron-LM has no ZeRO-2 or 3; its optimizer is ZeRO-0 (non-distributed) or "
               "ZeRO-1 (--use-distributed-optimizer): pick --zero 0 or 1")
    elif framework == "nanotron" and zero > 1:
        why = "nanotron shards the optimizer (ZeRO-1) or nothing: pick --zero 0 or 1"
    elif framework == "aa-scaling" and zero > 1:
        why = "Aleph Alpha's Scaling shards the optimizer (ZeRO-1) or nothing: pick --zero 0 or 1"
    elif framework == "fsdp" and zero < 2:
        why = "FSDP shards as ZeRO-2 (SHARD_GRAD_OP) or ZeRO-3 (FULL_SHARD): pick --zero 2 or 3"
    else:
        return None
    return Refusal(f"--zero {zero} under framework {framework}: {why}", key=f"--zero {zero}")


def megatron_state_bytes(n: int, precision: str, zero: int, dp: int) -> StateBytes:
    """Megatron-LM's model states for n parameters (its distrib_optimizer.md table): ZeRO-0
    the non-distributed optimizer, ZeRO-1 the distributed one over dp ranks (engine_problem
    refuses the others)."""
    shard = dp if zero == 1 else 1
    if precision == "fp32":   # the fp32 weights are the optimizer's: moments only
        return StateBytes(4 * n, 4 * n, 8 * n / shard, 0, 0, False)
    if precision == "bf16":   # fp32 gradient buffer, the optimizer reads it in place
        return StateBytes(2 * n, 4 * n, 12 * n / shard, 0, 0, False)
    # fp16 gradients: the optimizer's fp32 copy of them is allocated at the step
    # (non-distributed) or kept as a 1/d buffer of its own (distributed)
    if zero == 1:
        return StateBytes(2 * n, 2 * n, 16 * n / dp, 0, 0, False)
    return StateBytes(2 * n, 2 * n, 12 * n, 4 * n, 0, False)


def nanotron_state_bytes(n: int, precision: str, zero: int, dp: int) -> StateBytes:
    """nanotron's model states (overlap.py): Megatron's bf16 ones (the fp32 gradient buffer
    whole on every rank, fp32 master and moments sharded at ZeRO-1), and the model-dtype
    gradients a backward leaves on the parameters until they are added to the buffer, priced
    as a bucket alive in the backward (at the step too, where the backward's peak is the
    larger: activations are stored then)."""
    states = megatron_state_bytes(n, precision, zero, dp)
    return dataclasses.replace(states, bucket=act.act_bytes(precision) * n,
                               bucket_in_backward=True)


def fsdp_state_bytes(sp: StageParams, precision: str, zero: int, dp: int) -> StateBytes:
    """PyTorch FSDP's model states for a stage's parameters sp (see the module docstring):
    fp32 weights, gradients and moments sharded over dp, plus the gathered weights in the
    model dtype; zero 3 FULL_SHARD, 2 SHARD_GRAD_OP (engine_problem refuses the others)."""
    n, lp = sp.total, act.act_bytes(precision)
    root = n - sp.transformer
    gathered = n if zero == 2 else root + min(sp.layers, 2) * sp.max_layer
    return StateBytes(4 * n / dp + lp * gathered, 4 * n / dp, 8 * n / dp, 0, 0, False)


@dataclass(frozen=True)
class StageMemory:
    stage: int
    params: int
    weights: float
    grads: float
    optimizer: float
    activations: float      # stored for micro-batches in flight
    working: float          # one layer's backward working set, logits on the last stage
    step_transient: float
    bucket: float
    peak_bytes: float       # what the allocator sees at the peak (torch max_memory_allocated)
    reserved_bytes: float   # what the device must hold (allocator slack + runtime)

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / GIB

    @property
    def reserved_gb(self) -> float:
        return self.reserved_bytes / GIB

    @property
    def states_gb(self) -> float:
        return (self.weights + self.grads + self.optimizer) / GIB


def _pending_w_bytes(job: Job, lay: Layout, sp: StageParams, first: bool, last: bool,
                     vocab: int, moe_layers: int = 0, framework: str = "deepspeed") -> float:
    """Bytes one micro-batch keeps between its B and its W under a schedule that splits the
    backward (Schedule.split_backward): the linear layers' inputs and output gradients (a MoE
    layer's experts' in place of the dense MLP's: experts.io_delta)."""
    m, prec = job.model, job.precision
    per_w = sp.layers * act.layer_weight_grad_bytes(m, lay, prec)
    if moe_layers:
        per_w += moe_layers * sum(experts.io_delta(m, lay, framework)) * act.act_bytes(prec)
    if first:  # the embedding's output gradient, for its scatter-add
        per_w += act.boundary_bytes(m, lay, prec)
    if last:
        per_w += act.head_weight_grad_bytes(m, lay, vocab, prec)
    return per_w


def _spent_slot_bytes(job: Job, lay: Layout, stage: int, vocab: int,
                      whole_vocab: bool) -> float:
    """What a pipeline that keeps its spent stage outputs (Overlap.keeps_spent_outputs) holds on
    stage `stage` beside its micro-batches in flight: one spent micro-batch's output (the last
    stage's: its logits), where the step has more micro-batches than the stage has in flight
    (Scaling: max(2, min(p - r + 1, m)) slots on stage r for at most min(p - r, m) in flight;
    a stage's input is taken from its slot once its gradient is sent)."""
    if lay.grad_accum <= lay.pp - stage:
        return 0.0
    m, prec = job.model, job.precision
    if stage == lay.head_stage:
        return act.logits_elems(m, lay, vocab, whole_vocab) * act.act_bytes(prec)
    return act.boundary_bytes(m, lay, prec)


def _stage_activations(job: Job, lay: Layout, sp: StageParams, stage: int, c: Constants,
                       framework: str = "deepspeed"):
    m, prec = job.model, job.precision
    schedule = schedules.get(lay.schedule)
    ov = OVERLAP[framework]
    flash_cp = ov.flash_cp  # Megatron Core's CP attention keeps no block scores
    whole = ov.sp_whole_inputs
    per_mb = sp.layers * act.layer_stored_bytes(m, lay, prec, flash_cp, whole)
    fp8_kept = fp8.stored_delta(m, lay, prec) if job.fp8 else 0.0
    if lay.recompute != "full":  # the linear layers' inputs kept as FP8 copies
        per_mb += sp.layers * fp8_kept
    first, last = stage == 0, stage == lay.head_stage
    vocab = padded_vocab(m.vocab_size, m.make_vocab_size_divisible_by, lay.tp)
    if not last and not ov.frees_outputs:
        # the stage output kept for its backward (one per chunk when interleaved); Megatron
        # frees its data once sent (deallocate_pipeline_outputs, on in Megatron-LM's training
        # since 2022), and Llama 3's stack "proactively deallocate[s]" it
        per_mb += lay.interleave * act.boundary_bytes(m, lay, prec)
    moe_layers = experts.stage_moe_layers(m, lay, stage) if m.moe.num_experts else 0
    per_w = (_pending_w_bytes(job, lay, sp, first, last, vocab, moe_layers, framework)
             if schedule.split_backward else 0.0)
    if moe_layers:
        per_mb += moe_layers * experts.stored_delta(m, lay, prec, framework)
        if job.fp8:
            per_mb += moe_layers * experts.fp8_kept_delta(m, lay, prec, framework)
    stored = schedule.stored(lay.pipe, stage, per_mb, per_w)
    if ov.keeps_spent_outputs:
        stored += _spent_slot_bytes(job, lay, stage, vocab, ov.whole_vocab_logits)
    working = (act.layer_working_bytes(m, lay, prec, flash_cp, whole) + fp8_kept
               if sp.layers else 0.0)
    if moe_layers:
        working += experts.working_delta(m, lay, prec)
    if last:
        working += (act.logits_bytes(m, lay, vocab, prec, ov.whole_vocab_logits)
                    + act.boundary_bytes(m, lay, prec))
    return stored * c.act_scale, working * c.act_scale


def stage_states(job: Job, lay: Layout, sp: StageParams, c: Constants,
                 device: Optional[str] = None, framework: str = "deepspeed",
                 stage: int = 0) -> StateBytes:
    """state_bytes with the DeepSpeed settings the trainer uses for this layout on `device`
    ("gpu" or "cpu"; None: the profile's, zero_settings.profile_settings); the other engines'
    states for framework megatron-lm, megatron-core or fsdp; `sp` is pipeline stage `stage`'s."""
    problem = (engine_problem(framework, lay.zero)
               or grad_dtype_problem(job.grad_dtype, job.precision) or fp8.fp8_problem(job))
    if problem:
        raise InputError(problem)
    n_exp = expert_stage_params(job, lay, stage) if job.model.moe.num_experts else 0
    if not n_exp:
        return _with_fp8(job, lay, sp, _engine_states(job, lay, sp, c, device, framework,
                                                       lay.zero_dp))
    # experts' states partition over the expert-data-parallel group, the rest over dp x cp;
    # Megatron's engines hold 1/t of each expert (experts.expert_share)
    edp = experts.expert_dp(lay, framework)
    dense = dataclasses.replace(sp, transformer=sp.transformer - n_exp)
    held = round(n_exp * experts.expert_share(lay, framework))
    a = _engine_states(job, lay, dense, c, device, framework, lay.zero_dp)
    b = _engine_states(job, lay, StageParams(sp.layers, held, 0, 0, 0, 0), c, device,
                       framework, edp)
    kept = dataclasses.replace(sp, transformer=dense.transformer + held)
    return _with_fp8(job, lay, kept, StateBytes(
        a.weights + b.weights, a.grads + b.grads, a.optimizer + b.optimizer,
        a.step_transient + b.step_transient, a.bucket, a.bucket_in_backward,
        a.grads / lay.zero_dp + b.grads / edp))


def _with_fp8(job: Job, lay: Layout, sp: StageParams, states: StateBytes) -> StateBytes:
    """states with the FP8 weights a job with FP8 matrix multiplies keeps (fp8.weight_bytes)."""
    if not job.fp8:
        return states
    extra = fp8.weight_bytes(job, sp.transformer, sp.max_layer, lay.zero)
    return dataclasses.replace(states, weights=states.weights + extra)


def expert_stage_params(job: Job, lay: Layout, stage: int) -> int:
    """Expert parameters one rank of pipeline stage `stage` holds (params.expert_params)."""
    counts = layout_stage_layers(job.model.num_layers, lay)
    return expert_params(job.model, sum(counts[:stage]), counts[stage], lay.ep)


def _engine_states(job: Job, lay: Layout, sp: StageParams, c: Constants, device, framework,
                   dp: int) -> StateBytes:
    """The engine's states for the parameters sp (a stage's, or its dense or expert share)
    partitioned over dp ranks."""
    if framework in MEGATRON:
        return megatron_state_bytes(sp.total, megatron_precision(job.precision, job.grad_dtype),
                                    lay.zero, dp)
    if framework == "nanotron":
        return nanotron_state_bytes(sp.total, job.precision, lay.zero, dp)
    if framework == "fsdp":
        return fsdp_state_bytes(sp, job.precision, lay.zero, dp)
    ds = profile_settings(job, lay, c, device)
    return state_bytes(sp.total, sp.max_layer, job.precision, lay.zero, lay.pp, dp,
                       ds.reduce_bucket_size, bool(c.bucket_touched),
                       buffers=bucket_buffers(ds, lay.zero),
                       bucket_dtype_bytes=comm_bytes(ds, act.act_bytes(job.precision)),
                       reuse_distance=ds.stage3_max_reuse_distance,
                       grad_accum=job.grad_accum)


def stage_memory(job: Job, lay: Layout, sp: StageParams, stage: int, c: Constants,
                 device: Optional[str] = None, framework: str = "deepspeed") -> StageMemory:
    states = stage_states(job, lay, sp, c, device, framework, stage)
    stored, working = _stage_activations(job, lay, sp, stage, c, framework)
    base = states.weights + states.optimizer + c.fixed_gb * GIB
    backward = base + states.grads + stored + working
    if states.bucket_in_backward:
        backward += states.bucket
    # At the step ZeRO-1 frees the gradients outside this rank's partition first; Megatron's
    # distributed optimizer keeps its whole grad buffer (the parameter all-gather reuses it).
    freed = lay.zero == 1 and framework in DEEPSPEED
    kept = (states.grads_partition if states.grads_partition is not None
            else states.grads / lay.zero_dp)
    step_grads = kept if freed else states.grads
    step = base + step_grads + states.step_transient + states.bucket
    peak = max(backward, step)
    reserved = peak * (1 + c.frag) + c.framework_gb * GIB
    return StageMemory(stage, sp.total, states.weights, states.grads, states.optimizer, stored,
                       working, states.step_transient, states.bucket, peak, reserved)


def memory_per_stage(job: Job, lay: Layout, c: Constants, device: Optional[str] = None,
                     framework: str = "deepspeed") -> List[StageMemory]:
    params = all_stage_params(job.model, lay.tp, lay.pp, lay.ep,
                              counts=layout_stage_layers(job.model.num_layers, lay),
                              head_stage=lay.head_stage)
    return [stage_memory(job, lay, sp, i, c, device, framework) for i, sp in enumerate(params)]


def peak_memory(job: Job, lay: Layout, c: Constants, device: Optional[str] = None,
                framework: str = "deepspeed") -> StageMemory:
    """The stage with the highest peak: the one that decides whether a layout fits. Only the
    ends can be it: stage 0 has the most layers (uniform split), the most micro-batches in
    flight and the embedding; the last stage has the logits and the output layer; and any the
    schedule's record names (Schedule.peak_stages: under zbh1 a later stage's pending W).
    With set first/last stage layers (Layout.uneven) a middle stage can be it: all are priced."""
    peak_stages = schedules.get(lay.schedule).peak_stages(lay.pipe, job.model.num_layers)
    ends = range(lay.pp) if lay.uneven else sorted({0, lay.pp - 1, *peak_stages})
    counts = layout_stage_layers(job.model.num_layers, lay)
    stages = [stage_memory(job, lay, stage_params(job.model, lay.tp, lay.pp, i, lay.ep, counts,
                                                  lay.head_stage),
                           i, c, device, framework) for i in ends]
    return max(stages, key=lambda s: s.peak_bytes)
