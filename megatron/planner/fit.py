"""Whether a training job is predicted to fit the memory of the device it starts on.

megatron-train asks this before anything heavy is allocated (issue 21 item 6): a model that
cannot fit otherwise dies minutes later in the allocator, or on a CPU drives the machine into the
OOM killer. The prediction is memory.peak_memory for the layout the config runs on `world` ranks,
the busiest stage's; the verdict is "fits", "does not fit" or "unknown" (the planner cannot model
the config: the run is never blocked then). The caller measures the device (DeviceMemory); this
module reads no device and imports no torch.

What is compared with what:
- GPU: what the device must hold (the caching allocator's peak, its fragmentation and the
  runtime's context: StageMemory.reserved_bytes under the planner's default constants) against
  the device's total memory.
- CPU: what the run adds to resident memory (StageMemory.peak_bytes under the constants
  tests/integration/test_planner_measured_peak.py holds within 20% of measured, DeepSpeed's
  bucket counted only where gradients touch it, plus what DeepSpeed's import adds later)
  against this rank's share of host memory: the smallest of MemAvailable divided by the ranks on
  this node and what the job's limits leave (planner/host_memory.py: the memory cgroups,
  RLIMIT_AS). The interpreter and torch are already resident when these are read, so they are
  outside both figures."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from megatron.config import Config
from megatron.planner import ranges
from megatron.planner.jobs import layout_for, layout_values
from megatron.planner.layout import Job, Layout
from megatron.planner.memory import GIB, StageMemory, peak_memory
from megatron.planner.params import model_params
from megatron.planner.profile import Constants

FITS, MISFIT, UNKNOWN = "fits", "does not fit", "unknown"
GPU_CONSTANTS = Constants()
# fixed_gb on the CPU: what DeepSpeed's import and initialisation add to resident memory after the
# check (0.12 GB measured on this project's CPU machine with examples/local/tiny.yaml).
CPU_CONSTANTS = Constants(fixed_gb=0.125, bucket_touched=1.0)


@dataclass(frozen=True)
class DeviceMemory:
    kind: str                # "gpu" | "cpu"
    bytes_per_rank: float
    source: str              # where the figure came from, for the message


@dataclass(frozen=True)
class Verdict:
    status: str                          # FITS | MISFIT | UNKNOWN
    device: DeviceMemory
    needed_bytes: float = 0.0            # compared with device.bytes_per_rank
    stage: Optional[StageMemory] = None  # the busiest stage's prediction
    layout: Optional[Layout] = None
    reason: str = ""                     # why the planner cannot tell (UNKNOWN)

    @property
    def needed_gb(self) -> float:
        return self.needed_bytes / GIB

    @property
    def available_gb(self) -> float:
        return self.device.bytes_per_rank / GIB


def cpu_memory(meminfo: str, ranks_per_node: int) -> Optional[DeviceMemory]:
    """The CPU's share per rank of MemAvailable in /proc/meminfo's text; None without it."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            kib = float(line.split()[1])
            ranks = max(1, ranks_per_node)
            return DeviceMemory("cpu", kib * 1024 / ranks,
                                f"MemAvailable {kib * 1024 / GIB:.1f} GB / {ranks} "
                                f"rank{'s' if ranks > 1 else ''} on this node")
    return None


def unmodelled(cfg: Config) -> Optional[str]:
    """What of the config the memory model does not follow, or None."""
    p = cfg.parallel
    if p.pipeline_parallel_size > 1 and p.pipeline_partition_method != "uniform":
        return (f"parallel.pipeline_partition_method={p.pipeline_partition_method} "
                "(the planner splits layers uniformly)")
    if p.context_parallel_size > 1 and p.context_parallel_algo != "ulysses":
        return (f"parallel.context_parallel_algo={p.context_parallel_algo} (the planner prices "
                "it, but its ring memory is not yet checked against a measurement)")
    return None


def predict(cfg: Config, world: int, device: str) -> tuple:
    """(Layout, busiest StageMemory) of `cfg` on `world` ranks of a "gpu" or "cpu" device. The
    vocabulary is model.vocab_size: a tokenizer's, known only once it is loaded, may be larger."""
    job = Job(cfg.model, cfg.training.global_batch_size, cfg.training.precision,
              deepspeed=cfg.deepspeed, grad_accum=cfg.training.grad_accum_dtype)
    lay = layout_for(job, world, layout_values({}, cfg)[0])
    consts = CPU_CONSTANTS if device == "cpu" else GPU_CONSTANTS
    return lay, peak_memory(job, lay, consts, device)


def check(cfg: Config, world: int, memory: DeviceMemory) -> Verdict:
    """The verdict for `cfg` on `world` ranks of devices with `memory` each."""
    reason = unmodelled(cfg)
    if reason:
        return Verdict(UNKNOWN, memory, reason=reason)
    try:
        lay, stage = predict(cfg, world, memory.kind)
    except Exception as e:  # a config the planner does not understand must not block the run
        return Verdict(UNKNOWN, memory, reason=f"the planner cannot model it ({e})")
    needed = stage.peak_bytes if memory.kind == "cpu" else stage.reserved_bytes
    status = FITS if needed <= memory.bytes_per_rank else MISFIT
    return Verdict(status, memory, needed, stage, lay)


def edge_note(v: Verdict) -> str:
    """For a job predicted to fit a GPU at ranges.MARGIN of it or more, the line saying that
    the verdict is uncertain there (held-out sweeps priced so mostly ran out of memory); else
    "". Not on a CPU, whose constants are measured on this project's machine."""
    if v.status != FITS or v.device.kind != "gpu":
        return ""
    return ranges.margin_note(v.needed_gb, v.available_gb, "predicted",
                              "a smaller training.micro_batch_size, activation checkpointing "
                              "or more model or ZeRO parallelism leaves more room")


def _parts(s: StageMemory) -> str:
    """The main parts; the peak is the larger of the backward and the optimizer step, so they
    need not add up to it."""
    parts = [("weights", s.weights), ("gradients", s.grads), ("optimizer states", s.optimizer),
             ("activations", s.activations + s.working),
             ("optimizer-step buffers", s.step_transient + s.bucket)]
    return ", ".join(f"{name} {value / GIB:.1f}" for name, value in parts)


def remedies(cfg: Config, v: Verdict) -> List[str]:
    """What to change, the likelier help first: states (TP, PP, ZeRO) or activations."""
    p, t, s = cfg.parallel, cfg.training, v.stage
    dp = v.layout.zero_dp  # ZeRO shards over dp x cp
    states = [f"split the model with parallel.tensor_parallel_size or "
              f"parallel.pipeline_parallel_size (now {p.tensor_parallel_size} and "
              f"{p.pipeline_parallel_size}; on more ranks if need be)"]
    if p.zero_stage < 3:
        where = f"over the {dp} data-parallel ranks" if dp > 1 else "over data-parallel ranks"
        states.append(f"parallel.zero_stage=3 (now {p.zero_stage}) to shard the states {where}")
    if t.precision == "fp32":
        states.append("training.precision=bf16")
    acts = [f"a smaller training.micro_batch_size (now {t.micro_batch_size})",
            f"parallel.context_parallel_size (now {p.context_parallel_size}) to split each "
            "sequence over more ranks"]
    if t.activation_checkpointing != "full":
        acts.insert(0, f"training.activation_checkpointing=full (now "
                       f"{t.activation_checkpointing})")
    first_states = s.weights + s.grads + s.optimizer >= s.activations + s.working
    return states + acts if first_states else acts + states


def misfit_message(cfg: Config, v: Verdict) -> str:
    """The prediction, the memory, what to change; the caller says how to start anyway."""
    m, s = cfg.model, v.stage
    return (f"this job is predicted not to fit in memory: {v.needed_gb:.1f} GB per rank "
            f"(stage {s.stage} of {v.layout.key()}, {model_params(m) / 1e9:.2f}B parameters "
            f"with model.num_layers={m.num_layers}, model.hidden_size={m.hidden_size}; main "
            f"parts in GB: {_parts(s)}), but the {v.device.kind.upper()} has "
            f"{v.available_gb:.1f} GB per rank ({v.device.source}). To fit, try: "
            f"{'; '.join(remedies(cfg, v))}; or a smaller model (megatron-plan memory and "
            "megatron-plan search show the prediction per stage and find a layout that fits)")
