"""The training section (the step: batch, iterations, precision, recompute, loss scaling,
logging, when the run stops) and the eval section (periodic evaluation), read by the loop, the
model context, the data iterators, deepspeed.json and the planner."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Literal, Optional, Sequence

from megatron.config.errors import ConfigError
from megatron.config.sections.checks import check_choices, finite, positive
from megatron.config.sections.loss_scale import LossScaleConfig


def ramp_sizes(ramp: Optional[Sequence[int]], global_batch: int) -> List[int]:
    """Every global batch a step can take under rampup_batch_size `ramp` to `global_batch`,
    smallest first (the trainer's checks and megatron-plan's layouts)."""
    if ramp is None:
        return [global_batch]
    return list(range(ramp[0], global_batch + 1, ramp[1]))


@dataclass
class TrainingConfig:
    micro_batch_size: int = 2
    """Samples per forward and backward pass on one data-parallel rank."""
    global_batch_size: int = 8
    """Samples per optimizer step over all data-parallel ranks; a multiple of micro_batch_size x
    the data-parallel size (the quotient is the gradient accumulation)."""
    rampup_batch_size: Optional[List[int]] = None
    """[start, increment, samples]: Megatron-LM's --rampup-batch-size. Steps start at a global
    batch of `start` samples, which grows by `increment` each time another
    samples / ((global_batch_size - start) / increment) samples are consumed, up to
    global_batch_size once `samples` are (BLOOM-176B ran [192, 16, 9765625] to 2048). A step's
    batch follows from the samples consumed before it, so a resume continues the ramp exactly.
    start and increment are multiples of micro_batch_size x the data-parallel size; the
    micro-batch, and so the memory, stays the same. train_iters counts steps; the LR schedule
    counts steps, or samples with optimizer.lr_*_samples (as Megatron-LM's under a ramp).
    null: no ramp."""
    train_iters: Optional[int] = None
    """Optimizer steps of the whole run (a resumed run counts from its checkpoint's step); the
    LR schedule spans them. null: the steps train_samples takes, or 20 when it is null too."""
    train_samples: Optional[int] = None
    """Megatron-LM's --train-samples: the run's length in samples instead of steps. train_iters
    becomes the fewest steps whose batches (the ramp's under rampup_batch_size, then
    global_batch_size's) hold this many samples, the last one whole, so the run may pass it by
    less than a global batch; an LR schedule in samples (optimizer.lr_*_samples) ends its
    decay here unless lr_decay_samples says otherwise. Set this or train_iters, not both; a
    run's config.yaml says the length in samples alone (train_iters null), so a resume with
    another batch counts its steps again."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Precision of the model and its gradients: fp32; bf16; or fp16 with dynamic loss scaling
    (GPU only)."""
    grad_accum_dtype: Literal["model", "fp32"] = "model"
    """Precision gradients are accumulated in. model: the model's (training.precision).
    fp32: bf16 weights with fp32 gradients, which DeepSpeed runs with its BF16_Optimizer (one
    flat fp32 buffer per parameter group, updated a group at a time), as Megatron-LM keeps its
    main gradients: up to 4 bytes more a parameter on every rank (that buffer is not sharded;
    each bf16 gradient is freed as it is added in), exact accumulation over many
    micro-batches, and on one H200 a 1.3B model trained at 0.95-0.96x the speed of a plain
    PyTorch loop, where ZeRO-1's own optimizer runs at 0.83-0.85x (benchmarks/results/
    gpu_h200.md). Needs training.precision=bf16 and parallel.zero_stage=1, without mixture of
    experts."""
    seed: int = 1234
    """Seed of the weights' initialisation and of dropout (the data's shuffles use data.seed)."""
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    """Recompute in backward instead of keeping activations: none; full (each transformer layer's
    input only is kept); selective (the attention core's s x s scores are recomputed)."""
    clip_grad: float = 1.0
    """Gradients are scaled down to this global L2 norm when above it; 0: no clipping."""
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    """fp16's dynamic loss scaling, a sub-section (`training.loss_scale.*`)."""
    log_interval: int = 1
    """A metrics.jsonl line (and TensorBoard point) every this many steps."""
    exit_interval: int = 0
    """Checkpoint and stop after a step that is a multiple of this (0: never); the LR schedule
    still spans train_iters, so a later run resumes exactly where this one stopped."""
    exit_duration_minutes: float = 0.0
    """Megatron-LM's exit-duration: the run commits a checkpoint and exits 0 once the time left
    would not hold another step, a save and exit_reserve_seconds, this many minutes after it
    started (0: no limit).
    The batch job's end time (MEGATRON_JOB_END_TIME, or SLURM_JOB_END_TIME, Unix seconds)
    applies too."""
    exit_reserve_seconds: float = 10.0
    """Under a deadline (exit_duration_minutes or the batch job's end time), seconds kept free
    after the last save for the run's own exit (run report, process-group teardown, interpreter
    exit) and the job's (the srun step ending): training stops this much earlier. Raise it on
    thousands of nodes, where tearing down the communicators takes longer."""
    peak_tflops: Optional[float] = None
    """Peak dense TFLOP/s per device, the denominator of MFU. null: the built-in table for the
    detected GPU (config/devices.py); MFU is null where that is unknown."""
    tensorboard: bool = True
    """Write TensorBoard events into <run.dir>/tensorboard (rank 0)."""
    check_memory: bool = True
    """Before anything is allocated, megatron-train refuses a job the planner predicts will not
    fit the device's memory (megatron/planner/fit.py); false logs a warning and starts anyway."""

    def __post_init__(self):
        s = "training"
        if isinstance(self.loss_scale, dict):  # a saved config's mapping (Config.from_dict)
            self.loss_scale = LossScaleConfig(**self.loss_scale)
        finite(s, self)
        self._check_ramp()
        self._resolve_length()
        for name in ("micro_batch_size", "global_batch_size", "train_iters", "log_interval"):
            positive(s, name, getattr(self, name))
        positive(s, "exit_interval", self.exit_interval, allow_zero=True)
        positive(s, "exit_duration_minutes", self.exit_duration_minutes, allow_zero=True)
        positive(s, "exit_reserve_seconds", self.exit_reserve_seconds, allow_zero=True)
        positive(s, "clip_grad", self.clip_grad, allow_zero=True)
        if not 0 <= self.seed < 2 ** 62:  # each stage and TP rank adds an offset to it
            raise ConfigError(f"{s}.seed", self.seed, "an integer in [0, 2**62) (torch's "
                              "generators take 64 bits; 2**64 failed at the first seeding)")
        check_choices(s, self)
        if self.peak_tflops is not None:
            positive(s, "peak_tflops", self.peak_tflops)

    def _check_ramp(self) -> None:
        ramp, name = self.rampup_batch_size, "training.rampup_batch_size"
        if ramp is None:
            return
        fix = ("set it to [start, increment, samples], e.g. [16, 16, 100000], or null for no "
               "ramp")
        if len(ramp) != 3 or any(v <= 0 for v in ramp):
            raise ConfigError(name, ramp, "three positive integers [start batch, increment, "
                              "ramp-up samples]", fix)
        start, step, _ = ramp
        if start >= self.global_batch_size or (self.global_batch_size - start) % step:
            raise ConfigError(name, ramp, f"a start below training.global_batch_size="
                              f"{self.global_batch_size} and an increment that reaches it "
                              f"from there (global_batch_size - start a multiple of it)", fix)

    def _resolve_length(self) -> None:
        """train_iters from train_samples (or its default), or their agreement when both are
        set."""
        if self.train_samples is None:
            if self.train_iters is None:
                self.train_iters = 20
            return
        for name in ("global_batch_size", "train_samples"):
            positive("training", name, getattr(self, name))
        steps = self.steps_for(self.train_samples)
        if self.train_iters is None:
            self.train_iters = steps
        elif self.train_iters != steps:
            raise ConfigError("training.train_samples", self.train_samples,
                              f"unset while training.train_iters={self.train_iters} is set "
                              f"({self.train_samples} samples take {steps} steps here)",
                              "set the run's length once: train_iters (steps) or "
                              "train_samples (samples), and null the other")

    def steps_for(self, samples: int) -> int:
        """The fewest steps from the start whose batches hold `samples` samples."""
        steps = consumed = 0
        while consumed < samples and self.global_batch_at(consumed) < self.global_batch_size:
            consumed, steps = consumed + self.global_batch_at(consumed), steps + 1
        return steps + max(0, -(-(samples - consumed) // self.global_batch_size))

    def total_samples(self) -> int:
        """The samples the run's length names: train_samples, or what train_iters steps take."""
        return self.train_samples or self.samples_over(0, self.train_iters)

    def global_batch_at(self, consumed: int) -> int:
        """The global batch of the step that starts after `consumed` samples: global_batch_size,
        or under rampup_batch_size the ramp's (Megatron-LM's rule)."""
        if self.rampup_batch_size is None:
            return self.global_batch_size
        start, step, samples = self.rampup_batch_size
        if consumed >= samples:
            return self.global_batch_size
        per_increment = samples / ((self.global_batch_size - start) // step)
        return min(start + int(consumed / per_increment) * step, self.global_batch_size)

    def samples_over(self, consumed: int, steps: int) -> int:
        """The samples `steps` steps take from `consumed` on (the ramp's batches, then
        global_batch_size's)."""
        total = 0
        while steps > 0 and self.global_batch_at(consumed) < self.global_batch_size:
            batch = self.global_batch_at(consumed)
            total, consumed, steps = total + batch, consumed + batch, steps - 1
        return total + steps * self.global_batch_size

    def ramp_sizes(self) -> List[int]:
        """Every global batch a step can take, smallest first."""
        return ramp_sizes(self.rampup_batch_size, self.global_batch_size)


@dataclass
class EvalConfig:
    eval_interval: int = 0
    """Evaluate on the validation split every this many steps, and on the test split once at the
    end (0: no evaluation)."""
    eval_iters: int = 2
    """Global batches each evaluation averages the loss over."""

    def __post_init__(self):
        positive("eval", "eval_interval", self.eval_interval, allow_zero=True)
        positive("eval", "eval_iters", self.eval_iters)
