"""The parallel package in a world of one (no torch.distributed): every mapping is the identity,
the layers are plain linear/embedding layers, vocab-parallel cross-entropy is torch's; and the
rank grid agrees with DeepSpeed's pipeline topology, whose groups the pipeline engine builds."""
import pytest
import torch
import torch.nn.functional as F

from megatron.parallel import mappings as M
from megatron.parallel.cross_entropy import vocab_parallel_cross_entropy
from megatron.parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                      VocabParallelEmbedding, full_normal, shard)
from megatron.parallel.state import ParallelState, dense_grid, grid_coords

MAPPINGS = ["copy_to_tp_region", "reduce_from_tp_region", "scatter_to_tp_region",
            "gather_from_tp_region", "scatter_to_sequence_parallel_region",
            "gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region"]


@pytest.mark.parametrize("name", MAPPINGS)
def test_mapping_is_identity_without_a_group(name):
    x = torch.randn(4, 2, 6, requires_grad=True)
    y = getattr(M, name)(x, None)
    assert y is x


def test_layers_reduce_to_plain_ones():
    st = ParallelState.single()
    x = torch.randn(5, 2, 8)
    col = ColumnParallelLinear(8, 12, st, init_std=0.5, init_seed=3)
    assert torch.equal(col.weight, full_normal((12, 8), 0.5, 3))
    torch.testing.assert_close(col(x), F.linear(x, col.weight, col.bias), rtol=0, atol=0)
    row = RowParallelLinear(12, 8, st, init_std=0.5, init_seed=4)
    h = torch.randn(5, 2, 12)
    torch.testing.assert_close(row(h), F.linear(h, row.weight, row.bias), rtol=0, atol=0)
    emb = VocabParallelEmbedding(16, 8, st, init_seed=5)
    ids = torch.randint(0, 16, (5, 2))
    assert torch.equal(emb.partial(ids), F.embedding(ids, emb.weight))


def test_cross_entropy_matches_torch():
    logits = (torch.randn(6, 3, 20) * 30).requires_grad_()
    target = torch.randint(0, 20, (6, 3))
    ours = vocab_parallel_cross_entropy(logits, target, ParallelState.single())
    ref_logits = logits.detach().clone().requires_grad_()
    ref = F.cross_entropy(ref_logits.reshape(-1, 20), target.reshape(-1),
                          reduction="none").view(6, 3)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-5)
    weights = torch.randn(6, 3)
    (ours * weights).sum().backward()
    (ref * weights).sum().backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("stride", [1, 2])
def test_a_rank_draws_exactly_its_slice_of_the_full_tensor(dim, stride):
    """Sharded initialisation: each rank draws only its own lines, and they equal the slice of
    the full tensor that TP=1 draws, for every TP degree, split dimension and stride."""
    from megatron.parallel.layers import sharded_normal
    shape = (24, 36)
    full = full_normal(shape, 0.3, 7, dim)
    assert abs(full.std().item() - 0.3) < 0.05
    for t in (1, 2, 3, 4, 6):
        if shape[dim] % (t * stride):
            continue
        parts = [sharded_normal(shape, 0.3, 7, dim, r, t, stride) for r in range(t)]
        for r, part in enumerate(parts):
            assert torch.equal(part, shard(full, dim, r, t, stride)), (t, r)
    assert not torch.equal(full, full_normal(shape, 0.3, 8, dim))  # another seed, other values
    rows = full_normal((6, 40), 1.0, 7)
    assert len({tuple(r.tolist()) for r in rows}) == 6  # lines are not copies of each other


def test_shard_with_stride_takes_a_slice_of_each_block():
    full = torch.arange(16.0).view(8, 2)  # two blocks of 4 rows: [gate; up]
    assert shard(full, 0, 1, 2, stride=2).tolist() == [[4, 5], [6, 7], [12, 13], [14, 15]]


@pytest.mark.parametrize("tp, dp, pp", [(2, 2, 2), (4, 1, 2), (1, 4, 2), (2, 1, 4), (8, 2, 1)])
def test_grid_matches_deepspeed_topology(tp, dp, pp):
    topology = pytest.importorskip("deepspeed.runtime.pipe.topology",
                                   reason="DeepSpeed is not installed")
    topo = topology.PipeModelDataParallelTopology(num_pp=pp, num_mp=tp, num_dp=dp)
    for rank in range(tp * dp * pp):
        coord = topo.get_coord(rank)
        assert grid_coords(rank, tp, dp, pp) == (coord.model, coord.pipe, coord.data)
        at = {"tp": coord.model, "dp": coord.data, "pp": coord.pipe}
        assert dense_grid(tp=tp, pp=pp, dp=dp).rank_at(at) == rank


def test_a_model_built_under_a_device_context_lands_there():
    """`with torch.device(...)`: every weight, the seeded lines drawn on the CPU included, ends
    on that device (an MoE layer's experts and router too), and the context leaves nothing
    behind. The meta device stands in for a GPU; the values under a GPU's context (where the
    CPU generator used to fail: "Expected a 'cuda' device type for generator") are checked by
    tests/gpu/test_training_gpu_paths.py."""
    from megatron.config import load_config
    from megatron.model import build_model
    from megatron.parallel.layers import sharded_normal
    from megatron.parallel.state import ParallelState
    from tests.support.paths import ROOT
    with torch.device("meta"):
        assert sharded_normal((4, 6), 0.1, 3, 1).device.type == "meta"
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml",
                      ["model.moe.num_experts=4", "model.moe.top_k=2"])
    with torch.device("meta"):
        model = build_model(cfg, ParallelState.single(), 512)
    devices = {name: p.device.type for name, p in model.named_parameters()}
    assert set(devices.values()) == {"meta"}, {n: d for n, d in devices.items() if d != "meta"}
    assert torch.get_default_device().type == "cpu"
    assert sharded_normal((4, 6), 0.1, 3).device.type == "cpu"
