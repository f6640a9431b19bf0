"""The `mpu` object DeepSpeed asks for the tensor/data/pipeline groups, answered from our
ParallelState (DeepSpeed's "model parallel" is our tensor parallel).

DeepSpeed's data-parallel group is our data x context parallel one: the ranks of a context-
parallel group hold the same parameters, so their gradients are averaged and ZeRO partitions
over them too. The mpu deliberately has no get_sequence_parallel_* methods: DeepSpeed's own
Ulysses handling (which divides gradients by dp alone) stays off; our loss is each rank's mean
over its tokens, and the average over dp x cp of those is the mean over every token."""
from __future__ import annotations

from megatron.parallel.state import ParallelState


class DeepSpeedMPU:
    """The mpu interface DeepSpeed expects (model parallel = tensor parallel here)."""

    def __init__(self, state: ParallelState):
        self.state = state

    def get_model_parallel_rank(self):
        return self.state.tp_rank

    def get_model_parallel_world_size(self):
        return self.state.tp

    def get_model_parallel_group(self):
        return self.state.tp_group

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_data_parallel_rank(self):
        return self.state.dp_cp_rank

    def get_data_parallel_world_size(self):
        return self.state.dp_cp

    def get_data_parallel_group(self):
        return self.state.dp_cp_group

    def get_pipeline_model_parallel_rank(self):
        return self.state.pp_rank

    def get_pipeline_model_parallel_world_size(self):
        return self.state.pp

    def get_pipeline_model_parallel_group(self):
        return self.state.pp_group
