"""Transformer layers per pipeline stage: an even split, or uneven stages with set first and last
counts (parallel.pipeline_first_stage_layers / pipeline_last_stage_layers; Megatron-LM's
--decoder-first/last-pipeline-num-layers): the first stage also holds the embedding and the last
the output layer and loss, so published recipes give them fewer transformer layers (Llama 3 405B:
126 layers on 16 stages, one fewer on each end). One home for the rule: the trainer's validation
(validate.check_pipeline), its pipeline partitioning (engine/model.py, engine/chunks.py) and the
planner (planner/layout.py) all call it. Torch-free.

With model chunks (parallel.virtual_pipeline_size v > 1: interleaved 1F1B, ZB-V) the counts are
the first and the last model chunk's, the chunks that hold the embedding and the head, and the
rest split evenly over the other p v - 1 or - 2 chunks (as a per-virtual-stage layout such as
Megatron Core's --pipeline-model-parallel-layout writes it; its older first/last flags instead
split a rank's layers evenly over its chunks, which leaves the embedding's chunk as heavy as any
other).

Or the ends are counted instead of set (parallel.pipeline_embedding_as_layer,
pipeline_loss_as_layer; Megatron Core's account_for_embedding/loss_in_pipeline_split): the
embedding and the head each take one layer's place in an even split, so their chunks hold one
layer fewer, none when every chunk holds one (accounted_ends)."""
from __future__ import annotations

from typing import List, Optional, Tuple


def even_stage_layers(num_layers: int, pp: int) -> List[int]:
    """Transformer layers per stage, spread evenly; the first stages take any remainder
    (DeepSpeed's partition_uniform)."""
    base, extra = divmod(num_layers, pp)
    return [base + (1 if i < extra else 0) for i in range(pp)]


def uneven_problem(num_layers: int, pp: int, first: Optional[int], last: Optional[int],
                   chunks: int = 1) -> Optional[str]:
    """Megatron-LM's rule for set first/last counts (None: not set): PP > 1, at least one layer
    each, the rest split evenly (at least one layer each) over the stages in between, or with
    `chunks` model chunks per stage over the model chunks in between. None when the split is
    fine."""
    fixed = [v for v in (first, last) if v is not None]
    if not fixed:
        return None
    middle, rest = pp * chunks - len(fixed), num_layers - sum(fixed)
    if pp < 2 or min(fixed) < 1:
        return ("first/last stage layers need PP > 1 and at least 1 layer each "
                f"(got PP {pp}, {fixed})")
    where = "stage(s)" if chunks == 1 else f"model chunk(s) of the {pp} x {chunks}"
    if (middle == 0 and rest != 0) or (middle and (rest < middle or rest % middle)):
        return (f"first/last stage layers {fixed} leave {rest} of the {num_layers} layers for "
                f"{middle} other {where}: not an even split of at least one layer each")
    return None


def stage_layers(num_layers: int, pp: int, first: Optional[int] = None,
                 last: Optional[int] = None) -> List[int]:
    """Transformer layers per stage: the set first/last counts (uneven_problem checked them;
    0, a chunk of the embedding or the head alone, comes from accounted_ends), the rest even;
    else even_stage_layers."""
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


def chunk_owner(pp: int, chunk: int, v_shape: bool = False) -> Tuple[int, int]:
    """(pipeline rank, local chunk) of model chunk `chunk`: interleaved 1F1B's loop (rank r holds
    chunks r, r + p, ...) or, v_shape, ZB-V's V (rank r holds chunks r and 2 p - 1 - r). The
    executor's orders (engine/interleaved_order.py, engine/v_order.py) and the planner place
    chunks by it."""
    if v_shape:
        return (chunk, 0) if chunk < pp else (2 * pp - 1 - chunk, 1)
    return chunk % pp, chunk // pp


def rank_layers(num_layers: int, pp: int, chunks: int, v_shape: bool = False,
                first: Optional[int] = None, last: Optional[int] = None) -> List[int]:
    """Transformer layers per pipeline rank with `chunks` model chunks per rank: the sum of its
    chunks' (stage_layers over p x chunks), placed by chunk_owner."""
    return [len(held) for held in rank_layer_indices(num_layers, pp, chunks, v_shape, first,
                                                     last)]


def rank_layer_indices(num_layers: int, pp: int, chunks: int = 1, v_shape: bool = False,
                       first: Optional[int] = None, last: Optional[int] = None
                       ) -> List[List[int]]:
    """The transformer layers (0-based, in model order) each pipeline rank holds: model chunk c
    of the p x chunks (stage_layers) holds the next layers after chunk c - 1's, and chunk_owner
    places it; with one chunk a rank, its stage's contiguous run. Which of them are MoE layers
    (config/moe.is_moe_layer) follows."""
    out: List[List[int]] = [[] for _ in range(pp)]
    start = 0
    for chunk, layers in enumerate(stage_layers(num_layers, pp * chunks, first, last)):
        out[chunk_owner(pp, chunk, v_shape)[0]].extend(range(start, start + layers))
        start += layers
    return out


def accounted_ends(num_layers: int, chunks: int, embedding: bool, loss: bool
                   ) -> Tuple[Optional[int], Optional[int]]:
    """(first, last) model-chunk layer counts when the embedding and/or the output layer with the
    loss count as one transformer layer each in the even split over `chunks` model chunks
    (parallel.pipeline_embedding_as_layer / pipeline_loss_as_layer; Megatron Core's
    account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split): (L + e + l)
    / chunks a chunk, one fewer on a counted end, which holds none when each chunk holds one
    (Llama 3 405B: 126 layers, 16 stages x 8 chunks, the first chunk the embedding alone, the
    last the head and loss alone). None on a side not counted. accounted_problem checks the
    split."""
    per = (num_layers + int(embedding) + int(loss)) // chunks
    return (per - 1 if embedding else None, per - 1 if loss else None)


def chunk_ends(num_layers: int, chunks: int, first: Optional[int], last: Optional[int],
               embedding: bool, loss: bool) -> Tuple[Optional[int], Optional[int]]:
    """(first, last) model-chunk layer counts to split by: those of the ends counted as a layer
    (accounted_ends) where either is counted, else the set ones (None: not set). The trainer's
    config (validate.pipeline_stage_layers) and the planner's Layout read it alike."""
    if embedding or loss:
        return accounted_ends(num_layers, chunks, embedding, loss)
    return first, last


def accounted_problem(num_layers: int, pp: int, chunks: int, embedding: bool, loss: bool
                      ) -> Optional[str]:
    """Why the embedding/loss-as-a-layer split does not apply (one line), or None: it needs
    PP > 1 and the layers plus the counted ends in an even split over the p x chunks model
    chunks (Megatron Core asserts the same divisibility)."""
    if not (embedding or loss):
        return None
    counted = int(embedding) + int(loss)
    if pp < 2:
        return f"counting the embedding or the loss as a layer needs PP > 1 (got PP {pp})"
    total, n = num_layers + counted, pp * chunks
    where = "stages" if chunks == 1 else f"model chunks of the {pp} x {chunks}"
    if total % n:
        return (f"{num_layers} layers + {counted} counted end(s) = {total} do not split evenly "
                f"over the {n} {where}")
    if chunks == 1 and embedding and total == n:
        # the embedding's stage would hold no norm or bias: one optimizer parameter group where
        # every other stage holds two, and DeepSpeed's ZeRO gradient norm all-reduces once a
        # group over the pipeline, so it would wait forever (measured: a hang at the first step)
        return (f"the first of the {pp} stages would hold the embedding alone, which "
                "DeepSpeed's pipeline engine cannot step with the others; model chunks "
                "(virtual_pipeline_size > 1) run it")
    return None


def set_or_none(value: int) -> Optional[int]:
    """A config count (0: not set) as stage_layers takes it."""
    return value or None
