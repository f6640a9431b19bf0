"""Reading a run's checkpoint back as one unsharded GPTModel (for sampling and conversion)."""
from __future__ import annotations

import os
from typing import Optional, Tuple

import torch

from megatron.config import Config, InputError, load_config
from megatron.model import build_model
from megatron.parallel.state import ParallelState


def latest_checkpoint(ckpt_dir: str) -> str:
    latest = os.path.join(ckpt_dir, "latest")
    if not os.path.isfile(latest):
        raise InputError(f"no checkpoint in {ckpt_dir!r} (no 'latest' file); train with "
                         "training.save=true or point --run-dir at a run that saved one")
    with open(latest) as f:
        return os.path.join(ckpt_dir, f.read().strip())


def load_run(run_dir: str, vocab_size: int, tag_dir: Optional[str] = None
             ) -> Tuple[Config, torch.nn.Module]:
    """The run's config and its model with the latest weights, unsharded on the CPU. Only
    checkpoints written with TP=1 and PP=1 hold the whole model in one file."""
    cfg_path = os.path.join(run_dir, "config.yaml")
    cfg = load_config(cfg_path)
    if cfg.parallel.tensor_parallel_size != 1 or cfg.parallel.pipeline_parallel_size != 1:
        raise InputError(f"{cfg_path}: the checkpoint is sharded (tensor_parallel_size="
                         f"{cfg.parallel.tensor_parallel_size}, pipeline_parallel_size="
                         f"{cfg.parallel.pipeline_parallel_size}); this reader needs TP=1 and PP=1")
    folder = tag_dir or latest_checkpoint(os.path.join(run_dir, "checkpoints"))
    path = os.path.join(folder, "mp_rank_00_model_states.pt")
    if not os.path.isfile(path):
        raise InputError(f"checkpoint file {path!r} is missing; expected DeepSpeed's "
                         "mp_rank_00_model_states.pt written by megatron-train")
    state = torch.load(path, map_location="cpu", weights_only=False)["module"]
    model = build_model(cfg, ParallelState.single(), vocab_size)
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return cfg, model
