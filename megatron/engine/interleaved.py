"""The executor of chunked pipelines (parallel.pipeline_schedule=interleaved, runner
"virtual_stages", and zbv, runner "v_stages"): runs the schedule's order (engine/
interleaved_order.py, engine/v_order.py) over this rank's chunks (engine/chunks.py) and hands
the update to a plain DeepSpeed engine wrapped around them, called as DeepSpeed's
PipelineEngine calls its own base class, so the numbers are 1F1B's:

- each chunk pass runs through DeepSpeedEngine.forward (the PipelineEngine's ForwardPass does);
- the last chunk's loss goes to engine.backward (which divides it by the accumulation steps),
  every other chunk's backward is torch.autograd.backward on its output with the received
  gradient, flagged as an engine backward (the PipelineEngine's BackwardPass);
- after the last backward: the tied embedding's gradients summed over the first and last stage
  (ReduceTiedGrads), the gradients reduced over data parallelism (ReduceGrads), then
  _take_model_step (OptimizerStep), all at a forced accumulation boundary;
- the loss is the sum of the micro-batch losses over the accumulation steps, averaged over
  data parallelism and broadcast from the last stage (PipelineEngine._aggregate_total_loss).

Each chunk's gradients accumulate over micro-batches in micro-batch order, as under 1F1B.
Transfers: isend (never waited for until the step ends) and blocking recv, each message tagged
by (kind, chunk, micro-batch), so no order of posts can deadlock (interleaved_order.replay);
between two chunks of one rank (ZB-V's turn at rank p - 1) the tensor is handed over in memory.

The order is the module's (chunks.ChunkedModule.order: engine/interleaved_order.py, or
engine/v_order.py for ZB-V). An order with W passes splits each backward: B runs with its
chunk's WeightGradStore open (parallel/layers.defer_weight_grads), so the TP layers leave their
weight-gradient products there, and W runs them into .grad, in micro-batch order per chunk."""
from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from megatron.engine.chunks import ChunkedModule
from megatron.parallel.layers import WeightGradStore, defer_weight_grads

_ACT, _GRAD, _DOCS = 0, 1, 2


class InterleavedExecutor:
    """train_batch and eval_batch of one rank, over `engine` (DeepSpeed's plain engine whose
    module is `module`)."""

    def __init__(self, engine, module: ChunkedModule):
        self.engine, self.module = engine, module
        self.state = module.state
        self.p, self.v = self.state.pp, module.num_chunks
        self.last = self.p * self.v - 1
        # What the PipelineEngine's ReduceGrads does; DeepSpeed's own backward must not reduce.
        self.reduce = engine.enable_backward_allreduce
        engine.enable_backward_allreduce = False
        # ZeRO-1 then builds its reduction buffers itself, as for a pipeline's stage.
        engine.pipeline_parallelism = True
        engine.set_gradient_accumulation_boundary(False)
        # DeepSpeed's forward hooks each output to divide its incoming gradient by the
        # accumulation steps; the PipelineEngine lets only its last stage do that (whose loss
        # engine.backward has divided already): a chunk's output gradient is passed unscaled.
        engine._backward_prologue_per_tensor = _unscaled
        self.sends: List[Tuple[object, torch.Tensor]] = []
        self.order = module.order
        self.local: Dict[Tuple[int, int, int], torch.Tensor] = {}  # transfers within the rank
        self.stores: List[WeightGradStore] = []
        self.deferred = 0  # TP layers whose weight gradients wait for a W pass
        if getattr(self.order, "W", None) is not None:  # the order splits each backward
            self.stores = [WeightGradStore() for _ in module.chunks]
            self.deferred = sum(defer_weight_grads(chunk, store)
                                for chunk, store in zip(module.chunks, self.stores))

    # --- transfers -----------------------------------------------------------------------------

    def _rank_of(self, chunk: int) -> int:
        return self.state.pp_ranks[self.order.owner(self.p, chunk)[0]]

    def _chunk(self, local: int) -> int:
        return self.order.model_chunk(self.p, self.state.pp_rank, local)

    def _tag(self, kind: int, chunk: int, mb: int) -> int:
        return (kind * (self.last + 1) + chunk) * self.micro_batches + mb

    def _send(self, tensor: torch.Tensor, kind: int, chunk: int, mb: int, to_chunk: int) -> None:
        tensor = tensor.detach().contiguous()
        if self._rank_of(to_chunk) == self.state.rank:
            self.local[(kind, chunk, mb)] = tensor.clone()
            return
        work = dist.isend(tensor, self._rank_of(to_chunk), tag=self._tag(kind, chunk, mb))
        self.sends.append((work, tensor))  # the tensor lives until the send completes

    def _recv(self, kind: int, chunk: int, mb: int, from_chunk: int) -> torch.Tensor:
        if self._rank_of(from_chunk) == self.state.rank:
            return self.local.pop((kind, chunk, mb))
        if kind == _DOCS:
            buf = torch.empty(self.module.documents_shape, dtype=torch.int64, device=self.device)
        else:
            buf = torch.empty(self.module.boundary_shape, dtype=self.dtype, device=self.device)
        dist.recv(buf, self._rank_of(from_chunk), tag=self._tag(kind, chunk, mb))
        return buf

    def _drain(self) -> None:
        for work, _ in self.sends:
            work.wait()
        self.sends = []

    # --- passes --------------------------------------------------------------------------------

    def _load(self, data_iter: Iterator, micro_batches: int) -> Dict[int, Tuple]:
        """The step's micro-batches on the ranks that read them (the first chunk's tokens, the
        last chunk's labels: ranks 0 and p - 1, as DeepSpeed's LoadMicroBatch; both rank 0
        under ZB-V)."""
        if not (self.module.reads_tokens or self.module.holds_loss):
            return {}
        out = {}
        for mb in range(micro_batches):
            tokens, labels = next(data_iter)
            out[mb] = (tokens.to(self.device), labels.to(self.device))
        return out

    def _forward(self, local: int, mb: int, held: Dict, batches: Dict, train: bool):
        chunk = self._chunk(local)
        if chunk == 0:
            x = inputs = batches[mb][0]
        else:
            x = inputs = self._recv(_ACT, chunk - 1, mb, chunk - 1)
            x.requires_grad_(train)
            if self.module.documents_shape is not None:  # (hidden, documents) between chunks
                inputs = (x, self._recv(_DOCS, chunk - 1, mb, chunk - 1))
        out = self.engine(local, inputs)
        if chunk == self.last:
            loss = self.module.loss_fn(out, batches[mb][1])
            self.total = loss.detach().clone() if self.total is None else self.total + loss.detach()
            out = loss
        else:
            if isinstance(out, tuple):
                out, docs = out
                self._send(docs, _DOCS, chunk, mb, chunk + 1)
            self._send(out, _ACT, chunk, mb, chunk + 1)
        if train:
            held[(local, mb)] = (x, out)

    def _backward(self, local: int, mb: int, held: Dict) -> None:
        if self.stores:
            self.stores[local].open()
        try:
            self._backward_pass(local, mb, held)
        finally:
            if self.stores:
                self.stores[local].seal()

    def _weights(self, local: int, mb: int) -> None:
        """W: the chunk's deferred weight products of micro-batch `mb` into .grad (flagged as
        an engine backward, as the PipelineEngine's own backward pass is)."""
        self.engine._running_engine_backward = True
        try:
            self.stores[local].run(mb)
        finally:
            self.engine._running_engine_backward = False

    def _backward_pass(self, local: int, mb: int, held: Dict) -> None:
        chunk = self._chunk(local)
        x, out = held.pop((local, mb))
        if chunk == self.last:
            self.engine.backward(out)
        else:
            grad = self._recv(_GRAD, chunk + 1, mb, chunk + 1)
            self.engine._running_engine_backward = True
            try:
                torch.autograd.backward(tensors=(out,), grad_tensors=(grad,))
            finally:
                self.engine._running_engine_backward = False
        if chunk > 0:
            self._send(x.grad, _GRAD, chunk, mb, chunk - 1)

    # --- the step ------------------------------------------------------------------------------

    def _begin(self, micro_batches: int) -> None:
        self.micro_batches = micro_batches
        self.total: Optional[torch.Tensor] = None
        param = next(self.module.parameters())
        self.dtype, self.device = param.dtype, param.device

    def train_batch(self, data_iter: Iterator = None) -> torch.Tensor:
        engine, m = self.engine, engine_micro_batches(self.engine)
        engine.module.train()
        self._begin(m)
        batches, held = self._load(data_iter, m), {}
        for store in self.stores:
            store.reset()
        for kind, local, mb in self.order.rank_ops(self.p, self.state.pp_rank, self.v, m):
            if kind == self.order.F:
                self._forward(local, mb, held, batches, train=True)
            elif kind == self.order.B:
                self._backward(local, mb, held)
            else:
                self._weights(local, mb)
        self._drain()
        self._update()
        return self._aggregate(m)

    def _update(self) -> None:
        """ReduceTiedGrads, ReduceGrads and OptimizerStep of DeepSpeed's TrainSchedule."""
        engine = self.engine
        self.module.tied_grads_all_reduce()
        engine.set_gradient_accumulation_boundary(True)
        try:
            if self.reduce:
                engine.allreduce_gradients()
            engine._take_model_step(None)
        finally:
            engine.set_gradient_accumulation_boundary(False)

    @torch.no_grad()
    def eval_batch(self, data_iter: Iterator = None, num_micro_batches: Optional[int] = None
                   ) -> torch.Tensor:
        m = num_micro_batches or engine_micro_batches(self.engine)
        self.engine.module.eval()
        self._begin(m)
        batches = self._load(data_iter, m)
        for kind, local, mb in self.order.rank_ops(self.p, self.state.pp_rank, self.v, m):
            if kind == self.order.F:
                self._forward(local, mb, {}, batches, train=False)
        self._drain()
        return self._aggregate(m)

    def _aggregate(self, micro_batches: int) -> torch.Tensor:
        """The mean loss of the step's micro-batches, averaged over data parallelism on the last
        stage and broadcast from there to the pipeline."""
        state = self.state
        loss = torch.zeros((), dtype=torch.float32, device=self.device)
        if self.module.holds_loss:
            loss = (self.total / micro_batches).float()
            if state.dp_cp > 1:
                dist.all_reduce(loss, group=state.dp_cp_group)
                loss /= state.dp_cp
        dist.broadcast(loss, src=state.pp_ranks[self.module.last_rank], group=state.pp_group)
        return loss


def _unscaled(grad):
    return grad


def engine_micro_batches(engine) -> int:
    return engine.gradient_accumulation_steps()


def use_interleaved(engine, module: ChunkedModule, schedule: str) -> str:
    """Makes `engine` (DeepSpeed's plain engine over `module`) train and evaluate with the
    interleaved order: its train_batch and eval_batch become the executor's (instance
    attributes shadow the class's). Returns what changed, for the log."""
    executor = InterleavedExecutor(engine, module)
    engine.train_batch = executor.train_batch
    engine.eval_batch = executor.eval_batch
    engine.interleaved = executor
    deferred = (f", weight gradients of {executor.deferred} layers deferred"
                if executor.stores else "")
    return f"{module.num_chunks} model chunks on this rank ({schedule}){deferred}"
