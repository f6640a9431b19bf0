"""The `deepspeed:` section: expert DeepSpeed keys merged into the generated deepspeed.json.

A free-form mapping shaped like DeepSpeed's own JSON, checked against an allow-list of keys that
exist in DeepSpeed 0.19 (deepspeed/runtime/zero/config.py, runtime/config.py, comm/config.py):
communication, bucket and diagnostic settings. Keys the project writes itself from its own
sections (batch sizes, optimizer, precision, ZeRO stage, clipping, ...) are refused with the
name of the project's key; any other key is refused as unknown. A null value unsets a key, so
`--set deepspeed.zero_optimization.overlap_comm=null` returns to the project's default.

The schema lives here rather than in megatron/engine because Config checks the section when it
is built and config imports nothing above it; base/deepspeed_json.py merges it into the JSON.

    deepspeed:
      communication_data_type: fp32
      zero_optimization:
        overlap_comm: true
        reduce_bucket_size: 2.0e+8
"""
from __future__ import annotations

import copy
import re
from typing import Any, Callable, Dict, List, Mapping, Optional

import yaml

from megatron.config.errors import ConfigError

SECTION = "deepspeed"


def _bool(path: str, value):
    if not isinstance(value, bool):
        raise ConfigError(path, value, "true or false")
    return value


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _count(minimum: int, even: bool = False) -> Callable:
    """A whole number of elements, written 500000000, 5e8 or 5.0e+8 (YAML 1.1 reads 5e8 as a
    string; DeepSpeed's own configs spell bucket sizes that way)."""
    def check(path: str, value):
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            value = float(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(path, value, f"a whole number >= {minimum}")
        if even and value % 2:
            # DeepSpeed's ZeRO-1/2 asserts this (its all-gather buffers start 4-byte aligned).
            raise ConfigError(path, value, "an even number of elements")
        return value
    return check


def _choice(*allowed: str) -> Callable:
    def check(path: str, value):
        if value not in allowed:
            raise ConfigError(path, value, f"one of {', '.join(allowed)}")
        return value
    return check


def _names(path: str, value):
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(path, value, "a list of names")
    return list(value)


# The allow-list: key -> checker, or a nested mapping of the same form.
SCHEMA: Dict[str, Any] = {
    # None (unset): DeepSpeed communicates in the model's precision (training.precision).
    "communication_data_type": _choice("fp32", "fp16", "bf16"),
    "zero_optimization": {
        "overlap_comm": _bool,
        "contiguous_gradients": _bool,
        "reduce_scatter": _bool,
        "reduce_bucket_size": _count(1),
        "allgather_bucket_size": _count(2, even=True),
        "allgather_partitions": _bool,
        "use_multi_rank_bucket_allreduce": _bool,
        "round_robin_gradients": _bool,
        "stage3_prefetch_bucket_size": _count(0),
        "stage3_param_persistence_threshold": _count(0),
        "stage3_max_live_parameters": _count(0),
        "stage3_max_reuse_distance": _count(0),
    },
    "comms_logger": {"enabled": _bool, "verbose": _bool, "prof_all": _bool, "debug": _bool,
                     "prof_ops": _names},
    "wall_clock_breakdown": _bool,
    "memory_breakdown": _bool,
    "steps_per_print": _count(1),
}

# DeepSpeed keys the project writes from its own sections: DeepSpeed key -> the project's key.
OWNED: Dict[str, str] = {
    "train_batch_size": "training.global_batch_size",
    "train_micro_batch_size_per_gpu": "training.micro_batch_size",
    "gradient_accumulation_steps": "training.global_batch_size and training.micro_batch_size "
                                   "(accumulation = global / (micro x data-parallel size))",
    "optimizer": "the optimizer section (optimizer.lr, optimizer.adam_beta1, ...)",
    "scheduler": "the optimizer section (optimizer.lr_warmup_iters, optimizer.lr_decay_style, "
                 "...)",
    "fp16": "training.precision (fp16 loss scaling: training.loss_scale.initial_power, "
            "window, hysteresis, minimum)",
    "bf16": "training.precision",
    "amp": "training.precision",
    "torch_autocast": "training.precision",
    "data_types": "training.precision and training.grad_accum_dtype",
    "gradient_clipping": "training.clip_grad",
    "zero_optimization.stage": "parallel.zero_stage",
    "zero_allow_untested_optimizer": "the optimizer section (the optimizer is a torch AdamW)",
    "pipeline": "parallel.pipeline_parallel_size and parallel.pipeline_partition_method",
    "activation_checkpointing": "training.activation_checkpointing",
    "checkpoint": "checkpoint.save and checkpoint.load (docs/checkpoints.md)",
    "tensorboard": "training.tensorboard",
}


def _refuse_owned(path: str, value) -> None:
    key = path[len(SECTION) + 1:]
    if key in OWNED:
        shown = "{...}" if isinstance(value, dict) else value
        raise ConfigError(path, shown, f"a key the project does not set itself (it writes "
                          f"DeepSpeed's {key} from {OWNED[key]})",
                          f"remove it and set {OWNED[key]} instead")


def _child(schema: Mapping, path: str, name: str, value):
    """The checker or sub-schema for `name` under `path`; refuses owned and unknown keys."""
    full = f"{path}.{name}"
    _refuse_owned(full, value)
    if name not in schema:
        shown = "{...}" if isinstance(value, dict) else value
        raise ConfigError(full, shown, f"a DeepSpeed key this project passes through "
                          f"({', '.join(sorted(schema))} under {path})",
                          "remove it or fix its spelling")
    return schema[name]


def _check_mapping(schema: Mapping, path: str, raw) -> Dict[str, Any]:
    if not isinstance(raw, dict):
        raise ConfigError(path, raw, f"a mapping of keys ({', '.join(sorted(schema))})")
    out: Dict[str, Any] = {}
    for name, value in raw.items():
        spec = _child(schema, path, str(name), value)
        if value is None:
            continue  # null unsets the key
        if isinstance(spec, dict):
            value = _check_mapping(spec, f"{path}.{name}", value)
            if value:
                out[str(name)] = value
        else:
            out[str(name)] = spec(f"{path}.{name}", value)
    return out


def check_section(raw: Optional[Mapping]) -> Dict[str, Any]:
    """The validated section: every key allowed and typed, null values dropped."""
    return _check_mapping(SCHEMA, SECTION, dict(raw or {}))


def parse_override(key: str, text: str) -> Dict[str, Any]:
    """`zero_optimization.overlap_comm`, `true` -> {'zero_optimization': {'overlap_comm': True}};
    the value is read as YAML and checked like the file's; null unsets the key."""
    names = key.split(".")
    spec: Any = SCHEMA
    path = SECTION
    value: Any = None if text.strip().lower() in ("null", "none", "~") else _yaml(key, text)
    for i, name in enumerate(names):
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}.{'.'.join(names[i:])}", text,
                              f"no key under {path}, which takes a single value",
                              f"use --set {path}=VALUE")
        spec = _child(spec, path, name, value if i == len(names) - 1 else {})
        path = f"{path}.{name}"
    if value is not None:
        value = _check_mapping(spec, path, value) if isinstance(spec, dict) else spec(path, value)
    for name in reversed(names):
        value = {name: value}
    return value


def _yaml(key: str, text: str):
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        raise ConfigError(f"{SECTION}.{key}", text, "a value in YAML syntax") from None


def merge(base: Mapping, extra: Mapping, unset: bool = True) -> Dict[str, Any]:
    """`extra` merged into a copy of `base`, mappings key by key. A None in `extra` removes the
    key (unset=True) or is kept, to unset it in a later merge (unset=False: --set overrides
    gathered before they meet the file's values)."""
    out = copy.deepcopy(dict(base))
    for name, value in extra.items():
        if value is None and unset:
            out.pop(name, None)
        elif isinstance(value, dict) and isinstance(out.get(name), dict):
            out[name] = merge(out[name], value, unset)
        else:
            out[name] = copy.deepcopy(value)
    return out


def allowed_keys() -> List[str]:
    """Every allowed key as a dotted path (for docs and tests)."""
    def walk(schema: Mapping, prefix: str):
        for name, spec in schema.items():
            if isinstance(spec, dict):
                yield from walk(spec, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}"
    return sorted(walk(SCHEMA, ""))


def overlap_problem(section: Optional[Mapping], pipeline_parallel_size: int) -> Optional[str]:
    """Why an explicit overlap_comm cannot be honoured with this layout, or None."""
    zero = (section or {}).get("zero_optimization", {})
    if zero.get("overlap_comm") and pipeline_parallel_size > 1:
        return ("DeepSpeed's pipeline engine turns overlap_comm off (it reduces after the last "
                "micro-batch)")
    return None
