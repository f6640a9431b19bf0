"""The `mpu` object DeepSpeed asks for the tensor/data/pipeline groups, answered from our
ParallelState (DeepSpeed's "model parallel" is our tensor parallel)."""
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
        return self.state.dp_rank

    def get_data_parallel_world_size(self):
        return self.state.dp

    def get_data_parallel_group(self):
        return self.state.dp_group

    def get_pipeline_model_parallel_rank(self):
        return self.state.pp_rank

    def get_pipeline_model_parallel_world_size(self):
        return self.state.pp

    def get_pipeline_model_parallel_group(self):
        return self.state.pp_group
