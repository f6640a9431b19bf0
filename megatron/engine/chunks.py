"""This rank's model chunks under interleaved pipelines (parallel.virtual_pipeline_size = v):
the DeepSpeed-free module the interleaved executor (engine/interleaved.py) runs and DeepSpeed's
plain engine wraps for the optimizer step.

Model chunk c of p v holds the c-th block of L / (p v) decoder layers, as
model.pipeline_layers describes them, or with set first/last counts (parallel.pipeline_first_
stage_layers / _last_: config/stages.py) those on chunks 0 and p v - 1 and the rest even; chunk
0 also holds the embedding, the last chunk the final norm and the head. Which chunks a rank holds is its schedule's order's (PLACEMENTS, by
the record's runner id): interleaved 1F1B's loop, rank r holding chunks r, r + p, ... (local
chunk i is model chunk i p + r; engine/interleaved_order.py), or ZB-V's V, rank r holding
chunks r and 2 p - 1 - r (engine/v_order.py). With tied embeddings the first chunk and the last
each build the embedding, the last one's weight a copy of the first's made at build time, and
their gradients are summed before the update (tied_grads_all_reduce), as DeepSpeed's
TiedLayerSpec does for 1F1B: over the pair of ranks that hold them, or on the one rank that
holds both (ZB-V; a + b is b + a, so the sum is the pair's bit for bit). The copy is marked
ds_pipe_replicated so DeepSpeed's gradient norm counts the weight once."""
from __future__ import annotations

from typing import Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import nn

from megatron.config import schedules
from megatron.config.validate import pipeline_stage_layers
from megatron.engine import interleaved_order, v_order
from megatron.engine.mpu import DeepSpeedMPU
from megatron.model import PipeLayer, lm_loss
from megatron.parallel.state import ParallelState


def chunk_slices(num_layers: int, total_chunks: int, counts: Optional[Sequence[int]] = None
                 ) -> List[Tuple[int, int]]:
    """[start, end) into model.pipeline_layers' list (embedding, L layers, norm, head) of each
    model chunk: `counts` decoder layers each (None: equal blocks), the embedding on the first,
    the norm and head on the last."""
    counts = list(counts) if counts is not None else [num_layers // total_chunks] * total_chunks
    assert len(counts) == total_chunks and sum(counts) == num_layers, (counts, num_layers)
    bounds = [1]
    for layers in counts:
        bounds.append(bounds[-1] + layers)
    bounds[0], bounds[-1] = 0, num_layers + 3
    return list(zip(bounds[:-1], bounds[1:]))


class Chunk(nn.Module):
    """Consecutive pipeline layers run in turn (forward_fn in place of forward where given)."""

    def __init__(self, layers: Sequence[PipeLayer]):
        super().__init__()
        self.layers = nn.ModuleList(layer.cls(*layer.args) for layer in layers)
        self.fns = [layer.forward_fn for layer in layers]
        self.prefixes = [layer.name for layer in layers]
        self.tie_keys = [layer.tie_key for layer in layers]
        self.tied_attrs = [layer.tied_attr for layer in layers]

    def forward(self, x):
        for fn, module in zip(self.fns, self.layers):
            x = fn(module, x) if fn is not None else module(x)
        return x


class ChunkedModule(nn.Module):
    """This rank's v chunks; forward(local_chunk, x) runs one of them, so DeepSpeed's engine
    forward (the PipelineEngine's path for a stage) runs each chunk pass. Build it under
    torch.no_grad() (the tied weight is broadcast in place)."""

    def __init__(self, layers: List[PipeLayer], state: ParallelState, chunks: int,
                 boundary_shape: Tuple[int, ...], loss_fn, order=interleaved_order,
                 counts: Optional[Sequence[int]] = None,
                 documents_shape: Optional[Tuple[int, ...]] = None):
        super().__init__()
        self.state, self.num_chunks, self.loss_fn = state, chunks, loss_fn
        self.order = order  # the schedule's order: placement (model_chunk, owner) and passes
        self.boundary_shape = tuple(boundary_shape)  # every activation sent between chunks
        # data.reset_attention_mask / reset_position_ids: the micro-batch's documents ([2, b, s]
        # int64, model/context.Documents) sent with each activation; None: not carried
        self.documents_shape = documents_shape
        total = state.pp * chunks
        slices = chunk_slices(len(layers) - 3, total, counts)
        self.chunk_ids = [order.model_chunk(state.pp, state.pp_rank, local)
                          for local in range(chunks)]
        self.chunks = nn.ModuleList(Chunk(layers[slice(*slices[c])]) for c in self.chunk_ids)
        self.first_rank = order.owner(state.pp, 0)[0]  # pipeline ranks of the end chunks
        self.last_rank = order.owner(state.pp, total - 1)[0]
        tied = any(layer.tie_key for layer in layers)
        self.tie_local = tied and self.first_rank == self.last_rank  # both on one rank (ZB-V)
        self.tie_group = (_tie_group(state, self.first_rank, self.last_rank)
                          if tied and not self.tie_local else None)
        self._sync_tied()

    @property
    def reads_tokens(self) -> bool:
        return self.state.pp_rank == self.first_rank

    @property
    def holds_loss(self) -> bool:
        return self.state.pp_rank == self.last_rank

    def forward(self, chunk: int, x):
        return self.chunks[chunk](x)

    def tied_weights(self) -> List[nn.Parameter]:
        out = []
        for chunk in self.chunks:
            for module, key, attr in zip(chunk.layers, chunk.tie_keys, chunk.tied_attrs):
                if key:
                    out.append(module.get_parameter(attr))
        return out

    def _sync_tied(self) -> None:
        """The first stage's tied weight on the last stage too, which then counts it no more
        in the gradient norm (DeepSpeed's PipelineModule: the lowest rank owns it)."""
        for p in self.parameters():
            p.ds_pipe_replicated = False
        if self.tie_local:
            if not self.reads_tokens:  # that one rank holds both, and it is not this one
                return
            first, *copies = self.tied_weights()
            for weight in copies:
                weight.data.copy_(first.data)
                weight.ds_pipe_replicated = True
            return
        if self.tie_group is None:
            return
        for weight in self.tied_weights():
            dist.broadcast(weight.data, src=self.state.pp_ranks[self.first_rank],
                           group=self.tie_group)
            weight.ds_pipe_replicated = not self.reads_tokens

    def tied_grads_all_reduce(self) -> None:
        """The tied embedding's two gradient halves (input embedding, output head) summed."""
        if self.tie_local:
            weights = self.tied_weights()
            if len(weights) == 2 and all(w.grad is not None for w in weights):
                total = weights[0].grad + weights[1].grad
                for w in weights:
                    w.grad.copy_(total)
            return
        if self.tie_group is None:
            return
        for weight in self.tied_weights():
            if weight.grad is not None:
                dist.all_reduce(weight.grad, group=self.tie_group)

    def gpt_named_parameters(self) -> Iterator[Tuple[str, nn.Parameter]]:
        """This rank's parameters under their GPTModel (TP=1, PP=1) names."""
        for chunk in self.chunks:
            for prefix, module in zip(chunk.prefixes, chunk.layers):
                for name, param in module.named_parameters():
                    yield prefix + name, param

    def gpt_named_modules(self) -> Iterator[Tuple[str, nn.Module]]:
        """This rank's layers' submodules under their GPTModel names, each ending in '.' (the
        checkpointed buffers' owners: the MoE routers' expert bias, engine/state.buffer_states)."""
        for chunk in self.chunks:
            for prefix, module in zip(chunk.prefixes, chunk.layers):
                for name, sub in module.named_modules():
                    yield prefix + (name + "." if name else ""), sub


def _tie_group(state: ParallelState, first_stage: int, last_stage: int) -> Optional[object]:
    """The stages of the first and the last chunk in this rank's pipeline (same data, context
    and tensor position). Every rank creates every pair's group, in the same order
    (collective)."""
    world, pp = state.world_size, state.pp
    stride = world // pp  # pp is the outermost axis of the rank grid (parallel/state.py)
    mine = None
    for offset in range(stride):
        group = dist.new_group([offset + first_stage * stride, offset + last_stage * stride])
        if state.rank % stride == offset:
            mine = group
    return mine


class ChunkMPU(DeepSpeedMPU):
    """The groups DeepSpeed's PipelineEngine would see (its PipelineParallelGrid): its "model
    parallel" group spans pipeline x tensor ranks (our mp group), so the gradient norm of a
    plain DeepSpeed engine over this rank's chunks is summed over the whole pipeline; tensor
    slicing stays our tp group."""

    def get_model_parallel_rank(self):
        return self.state.index("mp")

    def get_model_parallel_world_size(self):
        return self.state.grid.group_size("mp")

    def get_model_parallel_group(self):
        return self.state.group("mp")

    def get_slice_parallel_rank(self):
        return self._rank("tensor_model")

    def get_slice_parallel_world_size(self):
        return self._size("tensor_model")

    def get_slice_parallel_group(self):
        return self._group("tensor_model")


def chunked_module(layers: List[PipeLayer], cfg, state: ParallelState) -> ChunkedModule:
    """This rank's parallel.virtual_pipeline_size chunks of model.pipeline_layers. The
    activations between chunks are the decoder's hidden states, [s, b, h], the sequence split
    over TP ranks under sequence parallelism."""
    seq = cfg.model.seq_length // cfg.parallel.context_parallel_size
    if cfg.parallel.sequence_parallel:
        seq //= cfg.parallel.tensor_parallel_size
    shape = (seq, cfg.training.micro_batch_size, cfg.model.hidden_size)

    def loss_fn(logits, labels):
        return lm_loss(logits, labels.to(logits.device), state)

    order = PLACEMENTS[schedules.get(cfg.parallel.pipeline_schedule).runner]
    if order is interleaved_order and cfg.parallel.pipeline_microbatch_group:
        # the micro-batches in groups of this size instead of pipeline_parallel_size
        order = interleaved_order.Grouped(cfg.parallel.pipeline_microbatch_group)
    documents = None  # the documents travel beside the activations (model/gpt.pipeline_layers)
    if cfg.data.document_setting is not None:
        documents = (2, cfg.training.micro_batch_size, cfg.model.seq_length)
    with torch.no_grad():  # the tied weight's broadcast stays out of autograd
        return ChunkedModule(layers, state, cfg.parallel.virtual_pipeline_size, shape, loss_fn,
                             order, counts=pipeline_stage_layers(cfg), documents_shape=documents)


# a chunked schedule's runner id (its record's, engine/runners.py) -> the module of its order
PLACEMENTS = {"virtual_stages": interleaved_order, "v_stages": v_order}
