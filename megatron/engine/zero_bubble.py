"""The zero-bubble ZB-H1 schedule (parallel.pipeline_schedule=zbh1) on DeepSpeed's
PipelineEngine, without touching DeepSpeed's files: a TrainSchedule subclass that yields the
order of pipe_order.stage_steps, one new instruction (BackwardWeightPass: a micro-batch's W pass),
and the engine's instruction map extended on the instance (DeepSpeed dispatches every
instruction through self._INSTRUCTION_MAP, a class attribute an instance attribute shadows).

B is DeepSpeed's own backward pass run while the stage's WeightGradStore is open: the TP layers
(parallel/layers.defer_weight_grads) leave their weight-gradient GEMMs in it, so B computes the
gradient the previous stage waits for, the gradients of norms and biases, and no weight GEMM.
W runs them through autograd's accumulation, as the last part of a full backward would. Every
W of a step runs before its ReduceTiedGrads, ReduceGrads and OptimizerStep, in micro-batch
order, so the gradients and the update are those of 1F1B bit for bit."""
from __future__ import annotations

from deepspeed.runtime.pipe import schedule as ds
from deepspeed.runtime.pipe.engine import PipelineEngine
from torch import nn

from megatron.config.schedules.zbh1 import ZBH1
from megatron.engine import pipe_order
from megatron.parallel.layers import WeightGradStore, defer_weight_grads


class BackwardWeightPass(ds.BufferOpInstruction):
    """The weight-gradient (W) pass of micro-batch `micro_batch` (held in buffer `buffer_id`)."""


_INSTRUCTION = {pipe_order.F: ds.ForwardPass, pipe_order.B: ds.BackwardPass,
                pipe_order.LOAD: ds.LoadMicroBatch, pipe_order.SEND_ACT: ds.SendActivation,
                pipe_order.RECV_ACT: ds.RecvActivation, pipe_order.SEND_GRAD: ds.SendGrad,
                pipe_order.RECV_GRAD: ds.RecvGrad}


class ZeroBubbleSchedule(ds.TrainSchedule):
    """DeepSpeed's TrainSchedule with each backward split into B and a later W, in the order
    pipe_order writes for `schedule` (a record that splits the backward)."""

    def __init__(self, micro_batches, stages, stage_id, schedule: str = ZBH1.name):
        super().__init__(micro_batches, stages, stage_id)
        self.schedule = schedule

    def steps(self):
        steps = pipe_order.stage_steps(self.schedule, self.stages, self.stage_id,
                                       self.micro_batches)
        for i, ops in enumerate(steps):
            cmds = []
            for op, mb in ops:
                if op == pipe_order.W:
                    cmds.append(BackwardWeightPass(self._buffer_idx(mb), micro_batch=mb))
                else:
                    cmds.append(_INSTRUCTION[op](self._buffer_idx(mb)))
            if i == len(steps) - 1:
                cmds += [ds.ReduceTiedGrads(), ds.ReduceGrads(), ds.OptimizerStep()]
            yield cmds


def _exec_backward_pass(self, buffer_id):
    """B: DeepSpeed's backward, the weight GEMMs left in the store as one micro-batch.
    DeepSpeed receives every output gradient into one buffer (grad_layer), and autograd hands
    that very tensor on through residual additions to the layers, whose deferred products keep
    it until their W, after the next receive: B runs on a copy, the buffer stays DeepSpeed's."""
    received = self.grad_layer
    if not self.is_last_stage():
        self.grad_layer = ([t.clone() for t in received] if isinstance(received, (list, tuple))
                           else received.clone())
    self.zb_store.open()
    try:
        PipelineEngine._exec_backward_pass(self, buffer_id)
    finally:
        self.zb_store.seal()
        self.grad_layer = received


def _exec_backward_weight_pass(self, buffer_id, micro_batch):
    """W: the micro-batch's weight gradients into .grad, as a non-last stage's backward puts
    them there (DeepSpeed's bf16 optimizer copies low-precision gradients into its fp32
    accumulators after each backward; its engine flags a backward it runs itself)."""
    bf16 = self.using_bf16_optimizer
    if bf16:
        self.optimizer.clear_lp_grads()
    self._running_engine_backward = True
    try:
        self.zb_store.run(micro_batch)
    finally:
        self._running_engine_backward = False
    if bf16:
        self.optimizer.update_hp_grads(clear_lp_grads=True)


def use_zero_bubble(engine: PipelineEngine, module: nn.Module, schedule: str = ZBH1.name) -> int:
    """Makes `engine` train with ZB-H1 (engine/runners.py's "zero_bubble" runner): its TP layers
    defer their weight gradients to a store of this stage, its train schedule is
    ZeroBubbleSchedule, and its instruction map runs B and W. Evaluation keeps DeepSpeed's
    inference schedule (no backward, nothing deferred). Returns the number of layers whose
    weight gradients are deferred."""
    store = WeightGradStore()
    deferred = defer_weight_grads(module, store)
    engine.zb_store = store
    instructions = dict(type(engine)._INSTRUCTION_MAP)
    instructions[ds.BackwardPass] = _exec_backward_pass
    instructions[BackwardWeightPass] = _exec_backward_weight_pass
    engine._INSTRUCTION_MAP = instructions

    def train_schedule():
        store.reset()
        return ZeroBubbleSchedule(micro_batches=engine.micro_batches, stages=engine.num_stages,
                                  stage_id=engine.stage_id, schedule=schedule)

    engine._train_schedule = train_schedule
    return deferred
