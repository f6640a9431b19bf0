"""The DeepSpeed config generated from ours; written to the run directory as deepspeed.json.

Communication defaults depend on the device (deepspeed_settings; the planner reads the same
function, so its memory and time models see the values the trainer runs with):

- CPU (gloo): overlap_comm off, DeepSpeed's 5e8-element buckets. A CPU has no separate
  communication stream to overlap on, and resident memory only counts the bucket pages that
  gradients touch, so this is what has always worked here.
- GPU: overlap_comm on for ZeRO 1-3 without pipeline parallelism (DeepSpeed's pipeline engine
  turns it off itself, with a warning); reduce_bucket_size sized to the model (gpu_bucket_size);
  allgather_bucket_size DeepSpeed's 5e8.
- communication_data_type is left to DeepSpeed, which communicates in the model's precision.
- A ZeRO group of one rank (data x context parallel = 1), on either device: overlap_comm and
  contiguous_gradients off at ZeRO 1-2. There is nothing to reduce, so the per-parameter
  backward hooks the two make ZeRO-1 register (292 Python calls a step for a 1.3B GPT, each
  copying a gradient into a bucket) are pure host time: 53 -> 45 ms a step on the CPU
  benchmark's shape, 59 -> 45 with the GPU's overlap_comm (ZeRO-2, whose hooks also partition
  the gradients, 60 -> 52). The losses are the same to the bit. ZeRO-3 keeps its own.

The `deepspeed:` section (config/deepspeed_section.py, which keeps its schema because the config
validates it at load time) is merged in last, key by key. Torch- and DeepSpeed-free: the planner
imports it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from megatron.config.deepspeed_section import merge

# DeepSpeed's default reduce/allgather bucket, in elements: the "5e8" of most Megatron-DeepSpeed
# configs and DeepSpeed's ZeRO tutorials.
DEEPSPEED_BUCKET = 500_000_000
# DeepSpeed's stage3_max_reuse_distance default (elements).
DEEPSPEED_REUSE_DISTANCE = 1_000_000_000
# 32 MB of bf16 gradients per collective: well past the point where a ring reduction is bound by
# bandwidth rather than per-message latency on NVLink/xGMI and Slingshot/InfiniBand.
MIN_GPU_BUCKET = 2 ** 24


def gpu_bucket_size(hidden_size: int, tensor_parallel_size: int) -> int:
    """reduce_bucket_size on GPUs: about one transformer layer's gradients per TP rank
    (12 h^2 / tp elements), rounded up to a multiple of 2**20 and kept within
    [MIN_GPU_BUCKET, 5e8]. With overlap_comm the reduction of one bucket runs while the backward
    of the layers below it computes, so only the last bucket (about 1/L of the reduction) is
    exposed, whereas a 5e8 bucket holds a whole stage of most layouts and starts reducing only
    when the backward ends. The bucket is allocated twice with overlap_comm (ZeRO-1/2 double
    buffer), so it is memory too: the 5e8 cap keeps it within what Megatron-DeepSpeed users
    already run with (2 x 1 GB in bf16)."""
    layer = 12 * hidden_size * hidden_size // tensor_parallel_size
    rounded = -(-layer // 2 ** 20) * 2 ** 20
    return min(DEEPSPEED_BUCKET, max(MIN_GPU_BUCKET, rounded))


@dataclass(frozen=True)
class DeepSpeedSettings:
    """The ZeRO communication settings a run uses, after defaults and the deepspeed section."""
    overlap_comm: bool
    contiguous_gradients: bool
    reduce_bucket_size: int
    allgather_bucket_size: int
    communication_data_type: Optional[str]  # None: the model's precision
    stage3_max_reuse_distance: int

    def zero_keys(self) -> Dict[str, Any]:
        """What the generated zero_optimization block states explicitly (ZeRO 1-3)."""
        return {"overlap_comm": self.overlap_comm,
                "contiguous_gradients": self.contiguous_gradients,
                "reduce_bucket_size": self.reduce_bucket_size,
                "allgather_bucket_size": self.allgather_bucket_size}


def deepspeed_settings(zero_stage: int, pipeline_parallel_size: int, tensor_parallel_size: int,
                       hidden_size: int, device_type: str = "cpu",
                       section: Optional[Mapping] = None, *,
                       zero_group_size: int) -> DeepSpeedSettings:
    """device_type: torch's device type ("cpu", or "cuda" for CUDA and ROCm alike); anything
    but "cpu" is a GPU. section: the config's validated `deepspeed:` mapping. zero_group_size:
    the ranks ZeRO averages gradients over and partitions over (data x context parallel)."""
    section = section or {}
    zero = section.get("zero_optimization", {})
    gpu = device_type != "cpu"
    # One rank in the group: nothing to reduce, so no hooks to overlap or gather it (module doc)
    hooks = zero_group_size > 1 or zero_stage == 3
    overlap = gpu and zero_stage > 0 and pipeline_parallel_size == 1 and hooks
    bucket = gpu_bucket_size(hidden_size, tensor_parallel_size) if gpu else DEEPSPEED_BUCKET
    return DeepSpeedSettings(
        overlap_comm=zero.get("overlap_comm", overlap),
        contiguous_gradients=zero.get("contiguous_gradients", hooks),
        reduce_bucket_size=zero.get("reduce_bucket_size", bucket),
        allgather_bucket_size=zero.get("allgather_bucket_size", DEEPSPEED_BUCKET),
        communication_data_type=section.get("communication_data_type"),
        stage3_max_reuse_distance=zero.get("stage3_max_reuse_distance",
                                           DEEPSPEED_REUSE_DISTANCE))


def config_settings(cfg, dp_size: int, device_type: str = "cpu") -> DeepSpeedSettings:
    """dp_size: the run's data-parallel size (its ZeRO group is dp_size x context parallel)."""
    p = cfg.parallel
    return deepspeed_settings(p.zero_stage, p.pipeline_parallel_size, p.tensor_parallel_size,
                              cfg.model.hidden_size, device_type, cfg.deepspeed,
                              zero_group_size=dp_size * p.context_parallel_size)


def deepspeed_config(cfg, dp_size: int, device_type: str = "cpu") -> Dict[str, Any]:
    """device_type: the run's torch device type (DeviceInfo.device.type); the default "cpu"
    keeps the CPU defaults."""
    t = cfg.training
    gas = t.global_batch_size // (t.micro_batch_size * dp_size)
    ds: Dict[str, Any] = {
        # DeepSpeed counts a micro-batch per rank of its data-parallel group, which is data x
        # context parallel (engine/mpu.py): the cp ranks of a sample each count it once.
        "train_batch_size": t.global_batch_size * cfg.parallel.context_parallel_size,
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": t.clip_grad,
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
        "zero_optimization": {"stage": cfg.parallel.zero_stage},
        # The optimizer is a torch object handed to deepspeed.initialize: DeepSpeed's own Adam
        # would JIT-compile an op at run time, which this project never does.
        "zero_allow_untested_optimizer": True,
    }
    if cfg.parallel.zero_stage > 0:
        ds["zero_optimization"].update(config_settings(cfg, dp_size, device_type).zero_keys())
    if t.precision == "bf16":
        ds["bf16"] = {"enabled": True}
        if t.grad_accum_dtype == "fp32":  # DeepSpeed's BF16_Optimizer (config/validate.py)
            ds["data_types"] = {"grad_accum_dtype": "fp32"}
            # Each bf16 gradient is added into the fp32 buffer by a hook as autograd writes
            # it, and freed: no second copy of every gradient at the peak, and the 292-tensor
            # loop after the backward of a 1.3B model becomes work the device's backward hides.
            ds["bf16"]["immediate_grad_update"] = True
    elif t.precision == "fp16":
        scale = t.loss_scale
        ds["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": scale.initial_power,
                      "loss_scale_window": scale.window, "hysteresis": scale.hysteresis,
                      "min_loss_scale": scale.minimum}
    if cfg.parallel.pipeline_parallel_size > 1:
        # Our transformer layers recompute themselves (training.activation_checkpointing),
        # restoring the tensor-parallel RNG streams too; DeepSpeed's own checkpointing would
        # also wrap the embedding stage, whose integer inputs carry no gradient, and fail.
        ds["pipeline"] = {"activation_checkpoint_interval": 0}
        if sequence_parallel_on(cfg):
            # DeepSpeed's pipeline engine sends 1/t of a stage's output from each TP rank and
            # all-gathers it on the receiver, assuming the output is replicated over TP. Under
            # sequence parallelism each TP rank holds its own shard: the receiver would splice
            # halves of two shards together. Each rank sends its whole shard instead.
            ds["pipeline"].update(pipe_partitioned=False, grad_partitioned=False)
    return merge(ds, cfg.deepspeed)


def sequence_parallel_on(cfg) -> bool:
    """Activations sharded along the sequence over TP (asked for, and TP > 1)."""
    return cfg.parallel.sequence_parallel and cfg.parallel.tensor_parallel_size > 1

