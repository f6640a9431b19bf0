"""The `mpu` object DeepSpeed asks for the tensor/data/pipeline groups, answered from our
ParallelState. This is where our named groups become DeepSpeed's notions, and nowhere else:

- DeepSpeed's "model parallel" is our tensor-parallel group tp.
- DeepSpeed's "data parallel" is our dp_cp group (data x context parallel): the ranks of a
  context-parallel group hold the same parameters, so their gradients are averaged and ZeRO
  partitions over them too.

The mpu deliberately has no get_sequence_parallel_* methods: DeepSpeed's own Ulysses handling
(which divides gradients by dp alone) stays off; our loss is each rank's mean over its tokens,
and the average over dp x cp of those is the mean over every token."""
from __future__ import annotations

from megatron.parallel.state import ParallelState

# DeepSpeed's name for a group -> the group of parallel/state.DENSE_GROUPS it means.
DEEPSPEED_GROUPS = {"model": "tp", "tensor_model": "tp", "data": "dp_cp",
                    "pipeline_model": "pp"}


class DeepSpeedMPU:
    """The mpu interface DeepSpeed expects: get_<name>_parallel_{rank,world_size,group} for each
    name of DEEPSPEED_GROUPS."""

    def __init__(self, state: ParallelState):
        self.state = state

    def _rank(self, name: str) -> int:
        return self.state.index(DEEPSPEED_GROUPS[name])

    def _size(self, name: str) -> int:
        return self.state.grid.group_size(DEEPSPEED_GROUPS[name])

    def _group(self, name: str):
        return self.state.group(DEEPSPEED_GROUPS[name])

    def get_model_parallel_rank(self):
        return self._rank("model")

    def get_model_parallel_world_size(self):
        return self._size("model")

    def get_model_parallel_group(self):
        return self._group("model")

    def get_tensor_model_parallel_rank(self):
        return self._rank("tensor_model")

    def get_tensor_model_parallel_world_size(self):
        return self._size("tensor_model")

    def get_tensor_model_parallel_group(self):
        return self._group("tensor_model")

    def get_data_parallel_rank(self):
        return self._rank("data")

    def get_data_parallel_world_size(self):
        return self._size("data")

    def get_data_parallel_group(self):
        return self._group("data")

    def get_pipeline_model_parallel_rank(self):
        return self._rank("pipeline_model")

    def get_pipeline_model_parallel_world_size(self):
        return self._size("pipeline_model")

    def get_pipeline_model_parallel_group(self):
        return self._group("pipeline_model")
