"""The DeepSpeed config generated from ours; written to the run directory as deepspeed.json."""
from __future__ import annotations

from typing import Any, Dict


def deepspeed_config(cfg, dp_size: int) -> Dict[str, Any]:
    t = cfg.training
    gas = t.global_batch_size // (t.micro_batch_size * dp_size)
    ds: Dict[str, Any] = {
        "train_batch_size": t.global_batch_size,
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
        ds["zero_optimization"].update({"overlap_comm": False, "contiguous_gradients": True})
    if t.precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif t.precision == "fp16":
        ds["fp16"] = {"enabled": True, "loss_scale": 0,
                      "initial_scale_power": t.initial_loss_scale_power,
                      "loss_scale_window": t.loss_scale_window, "hysteresis": t.hysteresis,
                      "min_loss_scale": t.min_loss_scale}
    if cfg.parallel.pipeline_parallel_size > 1:
        # Our transformer layers recompute themselves (training.activation_checkpointing),
        # restoring the tensor-parallel RNG streams too; DeepSpeed's own checkpointing would
        # also wrap the embedding stage, whose integer inputs carry no gradient, and fail.
        ds["pipeline"] = {"activation_checkpoint_interval": 0}
    return ds
