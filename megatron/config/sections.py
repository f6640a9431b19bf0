"""One dataclass per config section. Field checks live in __post_init__; checks that need
several sections live in validate.py. Field names follow Megatron-LM where one exists."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import List, Optional

from megatron.config import moe, schedules, variants
from megatron.config.errors import ConfigError


def _choice(section: str, name: str, value, allowed) -> None:
    if value not in allowed:
        raise ConfigError(f"{section}.{name}", value, f"one of {', '.join(map(str, allowed))}")


def _positive(section: str, name: str, value, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        raise ConfigError(f"{section}.{name}", value,
                          "a non-negative number" if allow_zero else "a positive number")


def _finite(section: str, obj) -> None:
    """Every float field of a section is finite. YAML reads .inf and .nan (and 1e999 overflows
    to inf); each later range check would compare false or true without a word."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{section}.{f.name}", value, "a finite number (not NaN or "
                              "infinity)")


def _fraction(section: str, name: str, value) -> None:
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"{section}.{name}", value, "a probability in [0, 1)")


@dataclass
class ModelConfig:
    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    # Grouped-query attention: number of key/value heads. None means multi-head attention.
    num_query_groups: Optional[int] = None
    # None: the activation's default (config/builtin_variants.py: 4h for GeLU, and 8h/3 rounded
    # up to a multiple of 64 for SwiGLU, the same FLOPs as 4h GeLU).
    ffn_hidden_size: Optional[int] = None
    seq_length: int = 64
    max_position_embeddings: Optional[int] = None
    # Used when the tokenizer does not fix the vocabulary (synthetic and null-tokenizer data).
    vocab_size: int = 512
    make_vocab_size_divisible_by: int = 128
    # The next four name registered variants (config/variants.py, builtin_variants.py)
    position_embedding_type: str = "learned"  # learned | rotary
    rotary_base: float = 10000.0
    normalization: str = "layernorm"  # layernorm | rmsnorm
    norm_epsilon: float = 1e-5
    activation: str = "gelu"  # gelu | swiglu
    add_bias_linear: bool = True
    tie_embeddings: bool = True
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    attention_backend: str = "auto"  # auto | flash | sdpa | math
    init_method_std: float = 0.02
    # Mixture of experts (config/moe.py, docs/moe.md); 0 experts: dense. moe_ffn_hidden_size
    # null: ffn_hidden_size; moe_capacity_factor null: dropless.
    num_experts: int = 0
    moe_top_k: int = 2
    moe_ffn_hidden_size: Optional[int] = None
    moe_layer_freq: int = 1
    moe_capacity_factor: Optional[float] = None
    moe_router: str = "softmax"  # softmax | softmax_renorm (Mixtral) | sigmoid (config/moe.py)
    moe_aux_loss_coeff: float = 0.01  # Switch/GShard load balancing
    moe_z_loss_coeff: float = 0.0  # router z-loss (ST-MoE)

    def __post_init__(self):
        s = "model"
        _finite(s, self)
        for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length",
                     "vocab_size", "make_vocab_size_divisible_by"):
            _positive(s, name, getattr(self, name))
        for kind, name in variants.KIND_FIELD.items():
            _choice(s, name, getattr(self, name), variants.choices(kind))
        _fraction(s, "hidden_dropout", self.hidden_dropout)
        _fraction(s, "attention_dropout", self.attention_dropout)
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError("model.hidden_size", self.hidden_size,
                              f"a multiple of model.num_attention_heads={self.num_attention_heads}")
        if self.num_query_groups is not None:
            _positive(s, "num_query_groups", self.num_query_groups)
            if self.num_attention_heads % self.num_query_groups:
                raise ConfigError("model.num_query_groups", self.num_query_groups,
                                  f"a divisor of model.num_attention_heads={self.num_attention_heads}")
        if self.max_position_embeddings is None:
            self.max_position_embeddings = self.seq_length
        if self.max_position_embeddings < self.seq_length:
            raise ConfigError("model.max_position_embeddings", self.max_position_embeddings,
                              f"at least model.seq_length={self.seq_length}")
        if self.ffn_hidden_size is None:
            act = variants.of(self, "activation")
            self.ffn_hidden_size = act.default_ffn(self.hidden_size) if act.default_ffn \
                else 4 * self.hidden_size
        _positive(s, "ffn_hidden_size", self.ffn_hidden_size)
        moe.check_fields(self)

    @property
    def kv_heads(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    zero_stage: int = 1
    sequence_parallel: bool = False
    # Context parallelism (Megatron's name; DeepSpeed-Ulysses' all-to-all algorithm, Megatron's
    # cp_comm_type=a2a): each of these ranks holds 1/context_parallel_size of every sequence;
    # attention exchanges heads for sequence around itself (docs/context_parallel.md). 1: off.
    # Data parallel size is then world / (tensor x pipeline x context parallel).
    context_parallel_size: int = 1
    # DeepSpeed pipeline partitioning: "uniform" spreads transformer layers evenly.
    pipeline_partition_method: str = "uniform"
    # The pipeline schedule (PP > 1), a record of config/schedules: "1f1b" is DeepSpeed's;
    # "zbh1" is the zero-bubble ZB-H1 schedule (Qi et al. 2023): each backward split into an
    # input-gradient pass and a deferred weight-gradient pass that fills the bubble. The same
    # gradients; docs/pipeline.md.
    pipeline_schedule: str = schedules.DEFAULT
    # How long a rank waits for the others in the rendezvous and start-up before the job fails
    # instead of hanging (torch's default: 10 minutes). From the first step on, the hang
    # watchdog's limits set the process groups' timeout (training.startup_timeout_minutes for
    # the first step and save, then hang_timeout_minutes or 5x the slowest phase, plus one
    # minute); with the watchdog off (both 0) this stays the timeout of every collective.
    timeout_minutes: int = 10
    # Experts of each MoE layer split over this many data-parallel ranks (docs/moe.md).
    expert_parallel_size: int = 1

    def __post_init__(self):
        _positive("parallel", "tensor_parallel_size", self.tensor_parallel_size)
        _positive("parallel", "pipeline_parallel_size", self.pipeline_parallel_size)
        _positive("parallel", "context_parallel_size", self.context_parallel_size)
        _positive("parallel", "expert_parallel_size", self.expert_parallel_size)
        _choice("parallel", "zero_stage", self.zero_stage, (0, 1, 2, 3))
        _choice("parallel", "pipeline_partition_method", self.pipeline_partition_method,
                ("uniform", "parameters"))
        _choice("parallel", "pipeline_schedule", self.pipeline_schedule, schedules.names())
        _positive("parallel", "timeout_minutes", self.timeout_minutes)


@dataclass
class TrainingConfig:
    micro_batch_size: int = 2
    global_batch_size: int = 8
    train_iters: int = 20
    precision: str = "fp32"  # fp32 | bf16 | fp16
    seed: int = 1234
    activation_checkpointing: str = "none"  # none | full | selective
    clip_grad: float = 1.0
    # fp16 dynamic loss scaling: start at 2**initial_loss_scale_power.
    initial_loss_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    min_loss_scale: float = 1.0
    log_interval: int = 1
    eval_interval: int = 0  # 0 disables periodic evaluation
    eval_iters: int = 2
    save_interval: int = 0  # 0 saves only at the end when checkpoint saving is enabled
    # Also save when this many minutes of wall clock have passed since the last save (0: never);
    # rank 0's clock decides and every rank follows, so all ranks save at the same step.
    save_interval_minutes: float = 0.0
    # Keep the newest N complete checkpoints; older ones are removed only after a newer one is
    # committed (0 keeps all). Incomplete ones are never removed.
    keep_last: int = 0
    save: bool = False
    # Checkpoint and stop after a step that is a multiple of this (0: never); the LR schedule
    # still spans train_iters, so a later run resumes exactly where this one stopped.
    exit_interval: int = 0
    # Megatron-LM's name: the run commits a checkpoint and exits 0 once the time left would not
    # hold another step and a save, this many minutes after it started (0: no limit). The batch
    # job's end time (MEGATRON_JOB_END_TIME, or SLURM_JOB_END_TIME, Unix seconds) applies too.
    exit_duration_minutes: float = 0.0
    # "auto": continue from the newest complete checkpoint in <run.dir>/checkpoints (a fresh
    # start when there is none), in whatever layout it was written; or a checkpoints folder, or
    # one checkpoint folder (step_N).
    load: Optional[str] = None
    # A resume refuses a checkpoint whose sample stream (model.seq_length, the data section's
    # corpus, split, tokenizer and seed) differs from this run's. true: resume weights, optimizer
    # and step anyway, and start the new stream at its first sample.
    new_data_stream: bool = False
    # true: resume on another sample stream at the checkpoint's position (consumed_samples), as
    # when a corpus grew or was rebuilt and the samples before the position need not be seen
    # again. The same files moved elsewhere need neither setting (they are known by content).
    keep_data_position: bool = False
    # A single-file model (megatron-convert to-single) to start from when no checkpoint is
    # resumed: weights only, in any layout; optimizer, step and data position start fresh.
    init_from: Optional[str] = None
    # Peak dense TFLOPs per device for MFU; None uses the built-in table for the detected GPU.
    peak_tflops: Optional[float] = None
    tensorboard: bool = True
    # Divergence guard (training/health.py): a non-finite loss always stops the run, with no
    # checkpoint of the diverged state. So do more consecutive skipped steps than these: for
    # non-finite gradients (fp32/bf16), and for fp16 loss-scale overflows (normal in bursts).
    max_skipped_steps: int = 5
    max_loss_scale_skips: int = 50
    # A loss above loss_spike_factor x the median of the last loss_spike_window losses is a spike
    # (0: not checked); loss_spike_action: log it, stop, or roll back to the newest checkpoint and
    # go on past the batches that caused it (at most max_rollbacks times in one run).
    loss_spike_factor: float = 0.0
    loss_spike_window: int = 50
    loss_spike_action: str = "log"
    max_rollbacks: int = 3
    # Before anything is allocated, megatron-train refuses a job the planner predicts will not
    # fit the device's memory (megatron/planner/fit.py); false logs a warning and starts anyway.
    check_memory: bool = True
    # The hang watchdog (training/watchdog.py): a rank whose step, agreement, evaluation, save or
    # load runs past its limit dumps every thread's stack into <run.dir>/hangs/, writes a hang
    # event and exits 4, so srun (--kill-on-bad-exit) or torchrun ends the job. Until the first
    # step is done the limit is startup_timeout_minutes (rendezvous, model, first step); then
    # the larger of hang_timeout_minutes and 5x the slowest such phase measured. 0: off.
    startup_timeout_minutes: float = 30.0
    hang_timeout_minutes: float = 5.0
    # Every straggler_interval steps (0: never) the ranks compare their median forward pass; one
    # above straggler_factor x the others' median in two windows in a row is named in a warning
    # and a straggler event.
    straggler_interval: int = 50
    straggler_factor: float = 1.2
    # Each rank checks its node before joining the job (launch/health.py: GPUs visible, a GEMM
    # against its float64 reference, free memory, MEGATRON_HEALTH_CHECK); a failing node ends
    # the job at once (exit 5) and the job chain leaves it out of the next job.
    check_node: bool = True
    # Silent data errors told apart from spikes (training/sdc.py): when the divergence guard
    # sees a spike or a non-finite loss, the step's batch is computed again without an update
    # and compared on each rank; a rank whose result differs is named ({"event":
    # "sdc_suspect"}), an identical result is a real spike and the guard's policy applies.
    rerun_suspect_steps: bool = False
    # Asynchronous checkpoints (training/checkpointer.py): each rank copies its pieces into host
    # memory and training goes on while a writer streams and fsyncs them; the commit protocol
    # is unchanged.
    async_save: bool = False
    # A node-local first tier for checkpoints (on Frontier /mnt/bb/$USER with #SBATCH -C nvme):
    # each rank writes there first, then the checkpoint is drained into run.dir/checkpoints and
    # committed there. None: write into run.dir directly.
    save_local_dir: Optional[str] = None

    def __post_init__(self):
        s = "training"
        _finite(s, self)
        for name in ("micro_batch_size", "global_batch_size", "train_iters", "log_interval",
                     "eval_iters"):
            _positive(s, name, getattr(self, name))
        _positive(s, "eval_interval", self.eval_interval, allow_zero=True)
        if self.new_data_stream and self.keep_data_position:
            raise ConfigError("training.keep_data_position", True, "false with "
                              "training.new_data_stream=true (start the new stream afresh, or "
                              "keep the position: one of the two)", "unset one of them")
        _positive(s, "save_interval", self.save_interval, allow_zero=True)
        _positive(s, "keep_last", self.keep_last, allow_zero=True)
        if self.save_interval_minutes < 0:
            raise ConfigError("training.save_interval_minutes", self.save_interval_minutes,
                              "a number of minutes >= 0", "use 0 to save by steps only")
        _positive(s, "exit_interval", self.exit_interval, allow_zero=True)
        _positive(s, "exit_duration_minutes", self.exit_duration_minutes, allow_zero=True)
        _positive(s, "startup_timeout_minutes", self.startup_timeout_minutes, allow_zero=True)
        _positive(s, "hang_timeout_minutes", self.hang_timeout_minutes, allow_zero=True)
        _positive(s, "straggler_interval", self.straggler_interval, allow_zero=True)
        if self.straggler_factor <= 1.0:
            raise ConfigError("training.straggler_factor", self.straggler_factor,
                              "a factor above 1", "e.g. 1.2: 20% slower than the median rank")
        for name in ("max_skipped_steps", "max_loss_scale_skips", "max_rollbacks"):
            _positive(s, name, getattr(self, name), allow_zero=True)
        _positive(s, "loss_spike_window", self.loss_spike_window)
        _choice(s, "loss_spike_action", self.loss_spike_action, ("log", "stop", "rollback"))
        if self.loss_spike_factor and self.loss_spike_factor <= 1.0:
            raise ConfigError("training.loss_spike_factor", self.loss_spike_factor,
                              "0 (off) or a factor above 1", "e.g. 3.0: a loss three times its "
                              "running median")
        _positive(s, "clip_grad", self.clip_grad, allow_zero=True)
        _choice(s, "precision", self.precision, ("fp32", "bf16", "fp16"))
        _choice(s, "activation_checkpointing", self.activation_checkpointing,
                ("none", "full", "selective"))
        if self.peak_tflops is not None:
            _positive(s, "peak_tflops", self.peak_tflops)
        if not isinstance(self.async_save, bool):
            raise ConfigError("training.async_save", self.async_save, "true or false")
        if self.save_local_dir is not None and not (
                isinstance(self.save_local_dir, str) and self.save_local_dir.startswith("/")):
            raise ConfigError("training.save_local_dir", self.save_local_dir,
                              "an absolute path on node-local storage (on Frontier /mnt/bb/$USER "
                              "with #SBATCH -C nvme)", "or leave it unset (null) to write "
                              "checkpoints into run.dir directly")


@dataclass
class OptimizerConfig:
    lr: float = 1e-3
    min_lr: float = 1e-4
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    lr_warmup_iters: int = 0
    lr_decay_style: str = "cosine"  # cosine | linear | constant
    # None: decay over training.train_iters.
    lr_decay_iters: Optional[int] = None

    def __post_init__(self):
        s = "optimizer"
        _finite(s, self)
        _positive(s, "lr", self.lr)
        _positive(s, "min_lr", self.min_lr, allow_zero=True)
        _positive(s, "weight_decay", self.weight_decay, allow_zero=True)
        _positive(s, "lr_warmup_iters", self.lr_warmup_iters, allow_zero=True)
        _choice(s, "lr_decay_style", self.lr_decay_style, ("cosine", "linear", "constant"))
        for name in ("adam_beta1", "adam_beta2"):
            _fraction(s, name, getattr(self, name))
        if self.min_lr > self.lr:
            raise ConfigError("optimizer.min_lr", self.min_lr, f"at most optimizer.lr={self.lr}")
        if self.lr_decay_iters is not None:
            _positive(s, "lr_decay_iters", self.lr_decay_iters)


def split_fractions(text: str) -> List[float]:
    """data.split '969,30,1' (or '90/5/5', or '1') -> train, valid, test fractions summing to 1."""
    sep = "," if "," in str(text) else "/"
    try:
        parts = [float(p) for p in str(text).split(sep)]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        raise ConfigError("data.split", text, "up to three non-negative weights for train, "
                          "valid and test, such as 969,30,1")
    parts += [0.0] * (3 - len(parts))
    return [p / sum(parts) for p in parts]


@dataclass
class DataConfig:
    synthetic: bool = True
    # Blend: a list of "WEIGHT PREFIX" strings or plain prefixes (equal weights). A prefix names
    # PREFIX.bin / PREFIX.idx in the Megatron MMIDIDX format.
    paths: List[str] = field(default_factory=list)
    # Train/valid/test shares of each dataset's sequences (Megatron's GPT split; a document is
    # one sequence unless preprocessed from a list of texts): "969,30,1", "90/5/5" or "1".
    split: str = "969,30,1"
    # null: pre-tokenized data, vocabulary model.vocab_size (its last id is end-of-document).
    tokenizer_type: str = "null"  # sentencepiece | gpt2 | huggingface | null
    tokenizer_model: Optional[str] = None  # SentencePiece .model or Hugging Face tokenizer.json
    vocab_file: Optional[str] = None  # GPT-2 vocab.json
    merges_file: Optional[str] = None  # GPT-2 merges.txt
    # Where sample indices are cached; None: next to each dataset. Must be shared by all nodes.
    cache_dir: Optional[str] = None
    seed: int = 1234  # document and sample shuffles
    # "cpp" uses the ahead-of-time built helper; "numpy" the bit-identical reference.
    index_impl: str = "auto"

    def __post_init__(self):
        _choice("data", "tokenizer_type", self.tokenizer_type,
                ("sentencepiece", "gpt2", "huggingface", "null"))
        _choice("data", "index_impl", self.index_impl, ("auto", "cpp", "numpy"))
        split_fractions(self.split)
        if not 0 <= self.seed < 2 ** 32:  # numpy's RandomState shuffles the documents
            raise ConfigError("data.seed", self.seed, "an integer in [0, 2**32)")
        if not self.synthetic and not self.paths:
            raise ConfigError("data.paths", self.paths,
                              "at least one dataset prefix when data.synthetic=false "
                              "(or set data.synthetic=true)")


@dataclass
class KernelsConfig:
    # auto: fused kernels where built and usable on this device, else the torch reference
    # (logged once); fused: fail at startup when a fused kernel cannot run; torch: never fused.
    mode: str = "auto"

    def __post_init__(self):
        _choice("kernels", "mode", self.mode, ("auto", "fused", "torch"))


@dataclass
class RunConfig:
    dir: str = "runs/default"
    # Weights & Biases, from rank 0, the same records as metrics.jsonl: "off", "offline" (files
    # under <run.dir>/wandb, for a later `wandb sync` from a login node) or "online".
    wandb: str = "off"
    wandb_project: str = "megatron-frontier"
    wandb_name: Optional[str] = None  # default: the run directory's name
    wandb_entity: Optional[str] = None
    wandb_tags: List[str] = field(default_factory=list)

    def __post_init__(self):
        if not self.dir:
            raise ConfigError("run.dir", self.dir, "a directory path")
        _choice("run", "wandb", self.wandb, ("off", "offline", "online"))
        if not self.wandb_project:
            raise ConfigError("run.wandb_project", self.wandb_project, "a W&B project name")
        if not isinstance(self.wandb_tags, list) or not all(
                isinstance(t, str) and t for t in self.wandb_tags):
            raise ConfigError("run.wandb_tags", self.wandb_tags, "a list of non-empty strings",
                              "e.g. --set 'run.wandb_tags=[frontier, 175b]'")


SECTIONS = {
    "model": ModelConfig,
    "parallel": ParallelConfig,
    "training": TrainingConfig,
    "optimizer": OptimizerConfig,
    "data": DataConfig,
    "kernels": KernelsConfig,
    "run": RunConfig,
}
