"""The model's mixture-of-experts sub-section (`model.moe`, config/moe.py, docs/moe.md): part of
the architecture, so the model builders, model_math, checkpoints and the planner read it through
the model section (m.moe), as one unit with it. Each field's docstring is its entry in
docs/config.md (config/reference.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from megatron.config.errors import ConfigError
from megatron.config.moe import ROUTERS, Router
from megatron.config.sections.checks import check_choices, finite

S = "model.moe"


@dataclass
class MoEConfig:
    num_experts: int = 0
    """Experts per MoE layer; 0: a dense model (every other field here is then unused)."""
    top_k: int = 2
    """Experts each token is routed to, between 1 and num_experts (Megatron-LM's
    --moe-router-topk)."""
    ffn_hidden_size: Optional[int] = None
    """Width of each expert's MLP. null: model.ffn_hidden_size."""
    layer_freq: int = 1
    """Every layer_freq-th layer from the first is MoE (Megatron-LM's integer --moe-layer-freq);
    1: every layer."""
    capacity_factor: Optional[float] = None
    """Tokens an expert takes, as a factor of its even share; the rest are dropped. null:
    dropless routing."""
    router: Router = "softmax"
    """Router scores: softmax (the chosen experts' probabilities as weights), softmax_renorm (the
    same experts, their probabilities renormalised to sum to 1: Mixtral's router, which the
    Hugging Face export needs), or sigmoid (the top-k scores normalised to sum to 1)."""
    aux_loss_coeff: float = 0.01
    """Weight of the Switch/GShard load-balancing loss; 0 switches it off."""
    z_loss_coeff: float = 0.0
    """Weight of the router z-loss (ST-MoE), which keeps router logits small; 0: off."""
    router_bias_update_rate: float = 0.0
    """Auxiliary-loss-free load balancing (DeepSeek-V3): a per-expert bias added to the router's
    scores for the top-k choice only (the weights stay unbiased), moved by this much toward
    balance after each optimizer step, from the step's loads summed over data-parallel ranks;
    kept in checkpoints. 0: no bias. DeepSeek-V3 used 0.001."""
    shared_expert_ffn_hidden_size: Optional[int] = None
    """Width of a shared expert (DeepSeek-MoE, Qwen-MoE): a dense MLP of the model's activation
    in each MoE layer that every token runs, its output added to the routed experts'; replicated,
    not split over expert-parallel ranks. null or 0: none."""

    def __post_init__(self):
        finite(S, self)
        check_choices(S, self)
        if self.shared_expert_ffn_hidden_size == 0:
            self.shared_expert_ffn_hidden_size = None  # one spelling of "none" in records
        if self.num_experts < 0:
            raise ConfigError(f"{S}.num_experts", self.num_experts,
                              "0 (a dense model) or a number of experts >= 1")
        if self.num_experts:
            self._check_moe()

    def _check_moe(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ConfigError(f"{S}.top_k", self.top_k,
                              f"between 1 and {S}.num_experts={self.num_experts}")
        if self.ffn_hidden_size is not None and self.ffn_hidden_size < 1:
            raise ConfigError(f"{S}.ffn_hidden_size", self.ffn_hidden_size,
                              "a positive width, or null for model.ffn_hidden_size")
        if self.layer_freq < 1:
            raise ConfigError(f"{S}.layer_freq", self.layer_freq,
                              "1 (every layer MoE) or k >= 1 (every k-th layer, from the first)")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ConfigError(f"{S}.capacity_factor", self.capacity_factor,
                              "a factor > 0, or null for dropless routing")
        if not self.router_bias_update_rate >= 0:
            raise ConfigError(f"{S}.router_bias_update_rate", self.router_bias_update_rate,
                              "a rate >= 0 (DeepSeek-V3: 0.001)", "use 0 for no router bias")
        if self.shared_expert_ffn_hidden_size is not None and \
                self.shared_expert_ffn_hidden_size < 0:
            raise ConfigError(f"{S}.shared_expert_ffn_hidden_size",
                              self.shared_expert_ffn_hidden_size,
                              "a positive width, or 0 / null for no shared expert")
        for name in ("aux_loss_coeff", "z_loss_coeff"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{S}.{name}", getattr(self, name), "a coefficient >= 0",
                                  "use 0 to switch that loss off")


__all__ = ["MoEConfig", "ROUTERS"]
