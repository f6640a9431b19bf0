"""The attention's q/k/v split: the same values and gradients as indexing the fused projection,
with a backward that writes the projection's gradient once."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from megatron.config import load_config
from megatron.model import build_model
from megatron.parallel.state import ParallelState
from tests.support.paths import ROOT


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func._schema.name.split("::")[-1])
        return func(*args, **(kwargs or {}))


def _attention(heads: int, kv_heads: int):
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml", [
        "model.num_layers=1", "model.hidden_size=64", f"model.num_attention_heads={heads}",
        f"model.num_query_groups={kv_heads}"])
    return build_model(cfg, ParallelState.single(), 512).layers[0].attention


def _by_indexing(attn, qkv):
    """The split as it was written before: index, then reshape."""
    s, b = qkv.shape[:2]
    g, d = attn.q_per_group, attn.head_dim
    qkv = qkv.view(s, b, attn.groups_local, g + 2, d)
    q = qkv[:, :, :, :g].reshape(s, b, attn.groups_local * g, d)
    return q, qkv[:, :, :, g], qkv[:, :, :, g + 1]


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (8, 1)])
def test_split_equals_indexing_in_values_and_gradients(heads, kv_heads):
    attn = _attention(heads, kv_heads)
    width = (heads + 2 * kv_heads) * attn.head_dim
    torch.manual_seed(0)
    qkv = torch.randn(5, 3, width, dtype=torch.float64)
    weights = [torch.randn(5, 3, n, attn.head_dim, dtype=torch.float64)
               for n in (heads, kv_heads, kv_heads)]
    grads = []
    for split in (attn._split, lambda t: _by_indexing(attn, t)):
        x = qkv.clone().requires_grad_()
        parts = split(x)
        for got, want_shape in zip(parts, weights):
            assert got.shape == want_shape.shape
        sum((p * w).sum() for p, w in zip(parts, weights)).backward()
        grads.append((parts, x.grad))
    (new_parts, new_grad), (old_parts, old_grad) = grads
    for new, old in zip(new_parts, old_parts):
        assert torch.equal(new, old)
    assert torch.equal(new_grad, old_grad)


def test_the_backward_writes_the_projections_gradient_once():
    attn = _attention(4, 4)
    x = torch.randn(5, 3, 3 * 4 * attn.head_dim, requires_grad=True)
    q, k, v = attn._split(x)
    loss = q.sum() + 2 * k.sum() + 3 * v.sum()
    ops = _Ops()
    with ops:
        loss.backward()
    assert not {"select_backward", "slice_backward", "add", "add_"} & set(ops.names), ops.names
    assert ops.names.count("cat") == 1, ops.names
