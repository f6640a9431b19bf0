"""The engine's translation of our named groups into DeepSpeed's notions, without a process
group: DeepSpeed's model parallel is tp, its data parallel is dp_cp (data x context parallel),
and DeepSpeed's own pipeline topology, built over dp_cp as its data axis, puts every rank where
the mpu says it is. A failure here means DeepSpeed would reduce or partition over other ranks
than the ones holding the same parameters."""
import pytest

from megatron.engine.mpu import DEEPSPEED_GROUPS, DeepSpeedMPU
from megatron.parallel.state import DENSE_GROUPS, ParallelState

LAYOUTS = [(2, 2, 2, 2), (1, 1, 4, 2), (2, 1, 1, 4), (4, 2, 1, 1), (1, 2, 3, 1)]


def _answers(mpu, name):
    return tuple(getattr(mpu, f"get_{name}_parallel_{what}")()
                 for what in ("rank", "world_size"))


def test_every_deepspeed_group_is_a_declared_group():
    assert set(DEEPSPEED_GROUPS.values()) <= {name for name, _ in DENSE_GROUPS}


@pytest.mark.parametrize("tp, pp, dp, cp", LAYOUTS)
def test_deepspeed_data_parallel_is_data_x_context(tp, pp, dp, cp):
    for rank in range(tp * pp * dp * cp):
        state = ParallelState(tp=tp, pp=pp, dp=dp, cp=cp, rank=rank)
        mpu = DeepSpeedMPU(state)
        assert _answers(mpu, "model") == _answers(mpu, "tensor_model") == (state.tp_rank, tp)
        assert _answers(mpu, "pipeline_model") == (state.pp_rank, pp)
        assert _answers(mpu, "data") == (state.dp_rank * cp + state.cp_rank, dp * cp)
        assert mpu.get_data_parallel_group() is None  # no process groups without a world


@pytest.mark.parametrize("tp, pp, dp, cp", LAYOUTS)
def test_deepspeed_topology_over_dp_cp_agrees_with_the_mpu(tp, pp, dp, cp):
    topology = pytest.importorskip("deepspeed.runtime.pipe.topology",
                                   reason="DeepSpeed is not installed")
    topo = topology.PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp * cp)
    for rank in range(tp * pp * dp * cp):
        mpu = DeepSpeedMPU(ParallelState(tp=tp, pp=pp, dp=dp, cp=cp, rank=rank))
        coord = topo.get_coord(rank)
        assert (coord.pipe, coord.data, coord.model) == (
            mpu.get_pipeline_model_parallel_rank(), mpu.get_data_parallel_rank(),
            mpu.get_model_parallel_rank())
