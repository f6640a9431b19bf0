"""Mixture of experts: a MoE layer (layer.py) from its router (router.py), token dispatch over
the expert-parallel ranks (dispatch.py) and the stacked experts (experts.py). docs/moe.md."""
from megatron.model.moe.layer import LayerStats, MoELayer

__all__ = ["LayerStats", "MoELayer"]
