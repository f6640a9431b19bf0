"""Reading a run's checkpoint back as one unsharded GPTModel (for sampling and conversion)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from megatron.config import Config
from megatron.checkpoint.convert import (build_single_model, checkpoint_folder, latest_checkpoint,
                                       merge_checkpoint, read_run_config)

__all__ = ["latest_checkpoint", "load_run"]


def load_run(run_dir: str, vocab_size: Optional[int] = None, tag_dir: Optional[str] = None
             ) -> Tuple[Config, torch.nn.Module]:
    """The run's config (with TP = PP = 1) and its model with the latest weights (or those in
    the checkpoint folder `tag_dir`), unsharded on the CPU in fp32. Checkpoints of any
    tensor/pipeline layout are merged (training/convert.py); the embedding keeps the padded rows
    of the layout it was trained with. vocab_size: the tokenizer's vocabulary, checked against
    the checkpoint (read from the run's tokenizer when None)."""
    cfg = read_run_config(run_dir)
    merged = merge_checkpoint(cfg, tag_dir or checkpoint_folder(run_dir), vocab_size)
    return merged.config, build_single_model(merged)
