"""How DeepSpeed sees our model: the pipeline layer specs built from model.pipeline_layers, and
the attributes DeepSpeed reads on tensor-parallel parameters."""
from __future__ import annotations

from torch import nn

from megatron.model import lm_loss, pipeline_layers
from megatron.parallel.state import ParallelState


def mark_tensor_parallel(module: nn.Module) -> None:
    """DeepSpeed's gradient norm counts a parameter once per TP rank when it carries
    `tensor_model_parallel` or `model_parallel`, and once in all otherwise. Those are the
    parameters the layers split over TP (parallel/layers.mark_tp sets partition_dim on them)."""
    for param in module.parameters():
        if getattr(param, "partition_dim", None) is not None:
            param.tensor_model_parallel = True
            param.model_parallel = True


def pipeline_module(cfg, state: ParallelState, ctx):
    """DeepSpeed's PipelineModule over our pipeline layers, with the token embedding tied
    between the first and the last stage. Build it under torch.no_grad(): DeepSpeed broadcasts
    the tied weight in place while building."""
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    specs = []
    for layer in pipeline_layers(cfg, ctx):
        if layer.tie_key:
            specs.append(TiedLayerSpec(layer.tie_key, layer.cls, *layer.args,
                                       forward_fn=layer.forward_fn,
                                       tied_weight_attr=layer.tied_attr))
        else:
            specs.append(LayerSpec(layer.cls, *layer.args))
    topo = PipeModelDataParallelTopology(num_pp=state.pp, num_mp=state.tp, num_dp=state.dp)
    method = {"uniform": "type:LayerStage", "parameters": "parameters"}[
        cfg.parallel.pipeline_partition_method]

    def loss_fn(logits, labels):
        return lm_loss(logits, labels.to(logits.device), state)

    return PipelineModule(layers=specs, topology=topo, loss_fn=loss_fn, partition_method=method,
                          activation_checkpoint_interval=0)
