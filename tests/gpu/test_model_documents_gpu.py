"""The model paths of packed documents and of Qwen-style heads on a GPU, none of which has run
on one yet: the document mask through SDPA's masked kernels (data.reset_attention_mask), the
per-sample rotary tables of data.reset_position_ids on the unfused bf16 path, and the per-head
query/key norm (model.attention.qk_norm) through the fused RMSNorm on [s, b, heads, d] rows.
Each is held in bf16 to the fp32 CPU model with the same weights; `check_on` runs on any
device, so its logic is exercised on the CPU as well (test_the_checks_hold_on_the_cpu)."""
from __future__ import annotations

import pytest
import torch

from megatron.config import load_config
from megatron.model import GPTModel, build_context
from megatron.parallel.state import ParallelState
from tests.support.paths import ROOT

QWEN = ["model.position_embedding_type=rotary", "model.normalization=rmsnorm",
        "model.activation=swiglu", "model.add_bias_linear=false", "model.num_query_groups=2",
        "model.attention.kv_channels=24", "model.attention.qk_norm=true",
        "model.attention_backend=sdpa", "data.reset_attention_mask=true",
        "data.reset_position_ids=true"]


def _model(device: torch.device, dtype: torch.dtype, kernels: str, sets=QWEN) -> GPTModel:
    cfg = load_config(f"{ROOT}/examples/local/tiny.yaml",
                      sets + [f"kernels.mode={kernels}", "model.seq_length=128"])
    ctx = build_context(cfg, ParallelState.single(), 512, device, eod=511)
    torch.manual_seed(0)
    model = GPTModel(cfg.model, ctx)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model.to(device=device, dtype=dtype)


def _packed(n: int = 2) -> tuple:
    g = torch.Generator().manual_seed(3)
    first, second = torch.randint(0, 511, (n, 40), generator=g), torch.randint(0, 511, (n, 87),
                                                                              generator=g)
    return torch.cat([first, torch.full((n, 1), 511), second], dim=1), second


def check_on(device: torch.device, dtype: torch.dtype, kernels: str, tol: float) -> None:
    """On `device` in `dtype`: the packed second document gives the fp32 CPU model's logits of
    that document alone (within tol of their largest magnitude), and the backward gives every
    parameter a finite gradient."""
    reference = _model(torch.device("cpu"), torch.float32, "torch").eval()
    model = _model(device, dtype, kernels).eval()
    model.load_state_dict({k: v.to(device=device, dtype=dtype)
                           for k, v in reference.state_dict().items()})
    packed, second = _packed()
    with torch.no_grad():
        alone = reference(second)
        got = model(packed.to(device))[41:].float().cpu()
    err = ((got - alone).abs().max() / alone.abs().max()).item()
    assert err <= tol, f"packed against alone on {device} in {dtype}: {err:.3g} > {tol}"
    model.train()
    model(packed.to(device)).float().square().mean().backward()
    bad = [n for n, p in model.named_parameters() if p.grad is None
           or not torch.isfinite(p.grad).all()]
    assert not bad, f"no or non-finite gradients: {bad}"


def test_the_checks_hold_on_the_cpu():
    check_on(torch.device("cpu"), torch.float32, "torch", 1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
@pytest.mark.parametrize("kernels", ["torch", "auto"])
def test_packed_documents_and_head_norms_on_the_gpu(kernels):
    """kernels=auto takes the fused RMSNorm for the head norms where a build is installed."""
    check_on(torch.device("cuda", torch.cuda.current_device()), torch.bfloat16, kernels, 3e-2)
