"""Transformer layers per pipeline stage: an even split, or uneven stages with set first and last
counts (parallel.pipeline_first_stage_layers / pipeline_last_stage_layers; Megatron-LM's
--decoder-first/last-pipeline-num-layers): the first stage also holds the embedding and the last
the output layer and loss, so published recipes give them fewer transformer layers (Llama 3 405B:
126 layers on 16 stages, one fewer on each end). One home for the rule: the trainer's validation
(validate.check_pipeline), its pipeline partitioning (engine/model.py) and the planner
(planner/layout.py) all call it. Torch-free."""
from __future__ import annotations

from typing import List, Optional


def even_stage_layers(num_layers: int, pp: int) -> List[int]:
    """Transformer layers per stage, spread evenly; the first stages take any remainder
    (DeepSpeed's partition_uniform)."""
    base, extra = divmod(num_layers, pp)
    return [base + (1 if i < extra else 0) for i in range(pp)]


def uneven_problem(num_layers: int, pp: int, first: Optional[int], last: Optional[int],
                   chunks: int = 1) -> Optional[str]:
    """Megatron-LM's rule for set first/last counts (None: not set): PP > 1, at least one layer
    each, the rest split evenly (at least one layer each) over the stages in between; not with
    model chunks (virtual stages are equal chunks). None when the split is fine."""
    fixed = [v for v in (first, last) if v is not None]
    if not fixed:
        return None
    middle, rest = pp - len(fixed), num_layers - sum(fixed)
    if pp < 2 or min(fixed) < 1 or chunks > 1:
        return ("first/last stage layers need PP > 1, at least 1 layer each and no interleaving "
                f"(one model chunk per stage; got PP {pp}, {fixed}, {chunks} chunk(s) per stage)")
    if (middle == 0 and rest != 0) or (middle and (rest < middle or rest % middle)):
        return (f"first/last stage layers {fixed} leave {rest} of the {num_layers} layers for "
                f"{middle} other stage(s): not an even split of at least one layer each")
    return None


def stage_layers(num_layers: int, pp: int, first: Optional[int] = None,
                 last: Optional[int] = None) -> List[int]:
    """Transformer layers per stage: the set first/last counts (uneven_problem checked them),
    the rest even; else even_stage_layers."""
    if first is None and last is None:
        return even_stage_layers(num_layers, pp)
    middle = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    counts = [rest // middle if middle else 0] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def set_or_none(value: int) -> Optional[int]:
    """A config count (0: not set) as stage_layers takes it."""
    return value or None
