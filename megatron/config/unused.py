"""Settings a config changes from their defaults that this run will not read, because another
setting turns off what reads them: a moe.top_k on a dense model, a loss-spike action with no
spike check, fp16's loss-scale settings under bf16. They are not errors (a dense baseline of a
MoE config, or a check switched off for one run, keeps them on purpose), but a run should not
look configured for something it does not do: start-up names each in one warning."""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, List, Tuple

from megatron.config import variants
from megatron.config.sections.optimizer import UNREAD_BY_STYLE, WSD_FIELDS

# (section path, fields, the reason they are unread, a test of the config that makes it so);
# rules naming the same field hold under exclusive conditions, so no field is named twice
_RULES: Tuple[Tuple[str, Tuple[str, ...], str, Any], ...] = (
    ("model.moe", ("top_k", "ffn_hidden_size", "layer_freq", "capacity_factor", "router",
                   "aux_loss_coeff", "z_loss_coeff", "router_bias_update_rate",
                   "shared_expert_ffn_hidden_size"),
     "model.moe.num_experts=0: a dense model", lambda c: c.model.moe.num_experts == 0),
    ("resilience", ("loss_spike_window", "loss_spike_action", "max_rollbacks"),
     "resilience.loss_spike_factor=0: no loss-spike check",
     lambda c: c.resilience.loss_spike_factor == 0),
    ("resilience", ("max_rollbacks",),
     "resilience.loss_spike_action is not rollback",
     lambda c: c.resilience.loss_spike_factor != 0 and c.resilience.loss_spike_action
     != "rollback"),
    ("training.loss_scale", ("initial_power", "window", "hysteresis", "minimum"),
     "only training.precision=fp16 scales the loss", lambda c: c.training.precision != "fp16"),
    ("resilience", ("max_loss_scale_skips",),
     "only training.precision=fp16 skips steps on overflow",
     lambda c: c.training.precision != "fp16"),
    ("eval", ("eval_iters",), "eval.eval_interval=0: no evaluation",
     lambda c: c.eval.eval_interval == 0),
    ("optimizer", UNREAD_BY_STYLE["constant"], "optimizer.lr_decay_style=constant",
     lambda c: c.optimizer.lr_decay_style == "constant"),
    ("optimizer", UNREAD_BY_STYLE["inverse-square-root"], "optimizer.lr_decay_style="
     "inverse-square-root has no end",
     lambda c: c.optimizer.lr_decay_style == "inverse-square-root"),
    ("optimizer", WSD_FIELDS, "optimizer.lr_decay_style is not wsd",
     lambda c: c.optimizer.lr_decay_style != "wsd"),
    ("model", ("rotary_base",), "model.position_embedding_type's positions rotate no queries "
     "or keys", lambda c: not variants.of(c.model, "position").rotates_qk),
    ("model.attention", ("add_qkv_bias",), "model.add_bias_linear=true puts biases on q, k "
     "and v already", lambda c: c.model.add_bias_linear),
    ("model.attention", ("sliding_window_pattern", "window_rotary_base"),
     "model.attention.sliding_window=0: every layer sees every earlier key",
     lambda c: c.model.attention.sliding_window == 0),
    ("model.attention", ("window_rotary_base",), "model.position_embedding_type's positions "
     "rotate no queries or keys", lambda c: not variants.of(c.model, "position").rotates_qk),
    ("model.rope_scaling", ("factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings"),
     "model.rope_scaling.type=none", lambda c: c.model.rope_scaling.type == "none"),
    ("model.rope_scaling", ("low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings"),
     "model.rope_scaling.type=linear divides every frequency alike",
     lambda c: c.model.rope_scaling.type == "linear"),
    ("checkpoint", ("new_data_stream", "keep_data_position"),
     "checkpoint.load is not set: a fresh start resumes no data stream",
     lambda c: c.checkpoint.load is None),
    ("checkpoint", ("roll_back",), "checkpoint.load=auto continues the newest checkpoint "
     "(a chain's later jobs)", lambda c: c.checkpoint.load == "auto"),
    ("parallel", ("sequence_parallel",), "parallel.tensor_parallel_size=1",
     lambda c: c.parallel.tensor_parallel_size == 1),
    ("parallel", ("context_parallel_algo", "ulysses_degree"),
     "parallel.context_parallel_size=1", lambda c: c.parallel.context_parallel_size == 1),
    ("parallel", ("pipeline_partition_method", "pipeline_first_stage_layers",
                  "pipeline_last_stage_layers", "pipeline_embedding_as_layer",
                  "pipeline_loss_as_layer", "pipeline_microbatch_group"),
     "parallel.pipeline_parallel_size=1", lambda c: c.parallel.pipeline_parallel_size == 1),
)


def _section(cfg, path: str):
    obj = cfg
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _changed(section, names: Iterable[str]) -> List[Tuple[str, Any]]:
    fields = {f.name: f for f in dataclasses.fields(section)}
    return [(n, getattr(section, n)) for n in names
            if getattr(section, n) != _default(fields[n])]


def _text(value) -> str:
    """A value as --set would take it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def unread_settings(cfg) -> List[str]:
    """'field=value (why)' for each changed setting this run will not read, in rule order."""
    out: List[str] = []
    for path, names, why, applies in _RULES:
        if not applies(cfg):
            continue
        out += [f"{path}.{name}={_text(value)} ({why})"
                for name, value in _changed(_section(cfg, path), names)]
    return out


def unread_note(cfg) -> str:
    """The start-up warning, or '' when every changed setting is read."""
    unread = unread_settings(cfg)
    if not unread:
        return ""
    return ("settings this run does not read, each turned off by another: " + "; ".join(unread)
            + " (set what turns them on, or leave them out)")
