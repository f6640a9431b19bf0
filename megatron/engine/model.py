"""How DeepSpeed sees our model: the pipeline layer specs built from model.pipeline_layers, and
the attributes DeepSpeed reads on tensor-parallel parameters."""
from __future__ import annotations

import re
from typing import List, Optional

from torch import nn

from megatron.model import PipeLayer, lm_loss
from megatron.parallel.state import ParallelState

# DeepSpeed's "uniform" partitioning balances the layers whose class name matches this.
_BALANCED_LAYER = "type:TransformerLayer"


def mark_tensor_parallel(module: nn.Module) -> None:
    """DeepSpeed's gradient norm (and its bf16 optimizer's) takes a parameter's gradient from
    every TP rank when it carries `tensor_model_parallel` or `model_parallel`, and from TP rank 0
    only otherwise, so a replicated parameter counts once. Those markers belong on the
    parameters the layers split over TP: the ones parallel/layers.mark_tp gave a partition_dim.
    Called before deepspeed.initialize."""
    for param in module.parameters():
        if getattr(param, "partition_dim", None) is not None:
            param.tensor_model_parallel = True
            param.model_parallel = True


def stage_bounds(layers: List[PipeLayer], counts: List[int]) -> List[int]:
    """The layer-spec index where each stage starts, and the spec count at the end, for
    `counts` transformer layers per stage: stage s > 0 starts at its first transformer layer,
    so the embedding stays on the first stage and the final norm and head on the last, as
    DeepSpeed's type-balanced partitioning places them. An end stage may hold none (the
    embedding or the norm and head alone: config/stages.accounted_ends); a middle one may not."""
    blocks = [i for i, layer in enumerate(layers)
              if re.search(_BALANCED_LAYER[len("type:"):], layer.cls.__name__, re.IGNORECASE)]
    if len(blocks) != sum(counts) or min(counts) < 0 or min(counts[1:-1], default=1) < 1:
        raise ValueError(f"{counts} transformer layers per stage for {len(blocks)} layers")
    # a last stage without layers starts after the last one, at the final norm
    after = blocks + [blocks[-1] + 1]
    starts = [after[sum(counts[:s])] for s in range(1, len(counts))]
    return [0, *starts, len(layers)]


def pipeline_module(layers: List[PipeLayer], partition_method: str, state: ParallelState,
                    counts: Optional[List[int]] = None):
    """DeepSpeed's PipelineModule over model.pipeline_layers, with the token embedding tied
    between the first and the last stage. partition_method: parallel.pipeline_partition_method;
    counts: transformer layers per stage when set (uneven stages, config/stages.py), which
    replace it. Build it under torch.no_grad(): DeepSpeed broadcasts the tied weight in place
    while building."""
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    specs = []
    for layer in layers:
        if layer.tie_key:
            specs.append(TiedLayerSpec(layer.tie_key, layer.cls, *layer.args,
                                       forward_fn=layer.forward_fn,
                                       tied_weight_attr=layer.tied_attr))
        else:
            specs.append(LayerSpec(layer.cls, *layer.args))
    # DeepSpeed's data axis is our data x context parallel (parallel/state.py: same rank order).
    topo = PipeModelDataParallelTopology(num_pp=state.pp, num_mp=state.tp, num_dp=state.dp_cp)
    method = {"uniform": _BALANCED_LAYER, "parameters": "parameters"}[partition_method]

    def loss_fn(logits, labels):
        return lm_loss(logits, labels.to(logits.device), state)

    cls = PipelineModule
    if counts is not None:
        bounds = stage_bounds(layers, counts)

        class StagedPipelineModule(PipelineModule):
            """DeepSpeed's module with the stage bounds given (it has no such method)."""

            def _partition_layers(self, method="uniform"):
                self.parts = list(bounds)
                stage = self._topo.get_coord(self.global_rank).pipe
                self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

        cls = StagedPipelineModule
    return cls(layers=specs, topology=topo, loss_fn=loss_fn, partition_method=method,
               activation_checkpoint_interval=0)
