"""The model paths of packed documents, of Qwen-style heads and of sliding windows on a GPU, none
of which has run on one yet: the document mask through SDPA's masked kernels
(data.reset_attention_mask), the per-sample rotary tables of data.reset_position_ids on the
unfused bf16 path, the per-head query/key norm (model.attention.qk_norm) through the fused
RMSNorm on [s, b, heads, d] rows, and model.attention.sliding_window through flash-attn's
window_size and SDPA's mask, and Gemma 3's layer on that window (model.residual, GeGLU, a
windowed layer's own rotary base, model.attention.softmax_scale) and Gemma 2's caps of the
scores and the logits (model.attention.logit_softcapping through the math core and flash-attn's
softcap, model.output.logit_softcapping). Each is held in bf16 to the
fp32 CPU model with the same weights; the checks run on any device, so their logic is exercised
on the CPU as well."""
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


WINDOW = ["model.position_embedding_type=rotary", "model.normalization=rmsnorm",
          "model.activation=swiglu", "model.add_bias_linear=false", "model.num_query_groups=2",
          "model.attention.sliding_window=24", "model.attention.sliding_window_pattern=2"]


# Gemma 3's layer on that window: GeGLU, head norms, norms after the sub-blocks, a scaled
# embedding, the windowed layers' own rotary base, the scores' own scale
GEMMA = WINDOW + ["model.activation=geglu", "model.attention.qk_norm=true",
                  "model.residual.post_norms=true", "model.residual.embedding_multiplier=8.0",
                  "model.attention.window_rotary_base=100.0",
                  "model.attention.softmax_scale=0.2"]
# Gemma 2's: no head norms, one rotary base, the scores and the logits capped (low enough to
# bite on these weights); sdpa has no cap, so the math core is the reference
GEMMA2 = WINDOW + ["model.activation=geglu", "model.residual.post_norms=true",
                   "model.residual.embedding_multiplier=8.0", "model.attention.softmax_scale=0.2",
                   "model.attention.logit_softcapping=0.3", "model.output.logit_softcapping=0.6"]


def window_check(device: torch.device, dtype: torch.dtype, backend: str, tol: float,
                 sets=WINDOW) -> None:
    """model.attention.sliding_window (24 of 128 keys, every other layer) through `backend` on
    `device`: the fp32 CPU sdpa model's logits within tol of their largest magnitude."""
    core = "math" if any("logit_softcapping" in s for s in sets) else "sdpa"
    reference = _model(torch.device("cpu"), torch.float32, "torch",
                       sets + [f"model.attention_backend={core}"]).eval()
    model = _model(device, dtype, "torch", sets + [f"model.attention_backend={backend}"]).eval()
    model.load_state_dict({k: v.to(device=device, dtype=dtype)
                           for k, v in reference.state_dict().items()})
    tokens = _packed()[0]
    with torch.no_grad():
        want, got = reference(tokens), model(tokens.to(device)).float().cpu()
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err <= tol, f"{backend} window on {device} in {dtype}: {err:.3g} > {tol}"


@pytest.mark.parametrize("sets", [WINDOW, GEMMA, GEMMA2], ids=["window", "gemma", "gemma2"])
def test_the_window_check_holds_on_the_cpu(sets):
    window_check(torch.device("cpu"), torch.float32, "math", 1e-4, sets)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
@pytest.mark.parametrize("backend", ["sdpa", "flash"])
def test_a_sliding_window_on_the_gpu(backend):
    """flash-attn's window_size (its left count is the window less the query's own key) and
    SDPA's masked kernel, against the CPU reference; flash skips where flash-attn is absent."""
    from megatron.model.attention_cores import flash_available
    if backend == "flash" and not flash_available("cuda", "bf16"):
        pytest.skip("flash-attn is not installed")
    window_check(torch.device("cuda", torch.cuda.current_device()), torch.bfloat16, backend,
                 3e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
@pytest.mark.parametrize("backend", ["sdpa", "flash"])
def test_gemmas_layer_on_the_gpu(backend):
    """Gemma 3's layer (GEMMA) through flash-attn or SDPA in bf16, against the CPU reference."""
    from megatron.model.attention_cores import flash_available
    if backend == "flash" and not flash_available("cuda", "bf16"):
        pytest.skip("flash-attn is not installed")
    window_check(torch.device("cuda", torch.cuda.current_device()), torch.bfloat16, backend,
                 3e-2, GEMMA)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
@pytest.mark.parametrize("backend", ["math", "flash"])
def test_gemma2s_caps_on_the_gpu(backend):
    """Gemma 2's layer (GEMMA2): the math core's caps in bf16, and flash-attn's softcap
    argument (flash-attn 2.6 on), against the CPU reference."""
    from megatron.model.attention_cores import flash_available
    if backend == "flash" and not flash_available("cuda", "bf16"):
        pytest.skip("flash-attn is not installed")
    window_check(torch.device("cuda", torch.cuda.current_device()), torch.bfloat16, backend,
                 3e-2, GEMMA2)
