"""Job.grad_dtype (megatron/planner/grad_dtype.py): bf16 gradient buffers and reduction
(Megatron-LM's --grad-reduce-in-bf16) against hand calculations; the default unchanged."""
import dataclasses

import pytest

from megatron.config.errors import InputError
from megatron.planner.layout import Job, Layout
from megatron.planner.memory import peak_memory
from megatron.planner.models import preset_model
from megatron.planner.params import stage_params
from megatron.planner.profile import Constants, load_profile
from megatron.planner.timing import COMM, _Ctx, reduction_features, step_time

M = preset_model("gpt3-1.3b")


def _lay(zero: int) -> Layout:
    return Layout(tp=1, pp=1, dp=8, micro_batch=1, grad_accum=8, zero=zero)


@pytest.mark.parametrize("zero,want", [(0, lambda d: 20), (1, lambda d: 4 + 16 / d)])
def test_megatron_bf16_gradients_hold_the_fp16_row_of_megatrons_table(zero, want):
    """bf16 buffer (2 bytes) instead of fp32 (4): 2 + 2 + 16 without the distributed optimizer
    (the step's fp32 copy included), 2 + 2 + 16/d with it."""
    job = Job(M, 64, "bf16", grad_dtype="bf16")
    s = peak_memory(job, _lay(zero), Constants(), framework="megatron-core")
    total = s.weights + s.grads + s.optimizer + s.step_transient + s.bucket
    assert s.grads == pytest.approx(2 * s.params)
    assert total / s.params == pytest.approx(want(8))
    default = peak_memory(Job(M, 64, "bf16"), _lay(zero), Constants(), framework="megatron-core")
    assert default.grads == pytest.approx(4 * s.params)


@pytest.mark.parametrize("grad_dtype,wire", [(None, 2), ("bf16", 2), ("fp32", 4)])
def test_the_reduction_sends_the_gradient_dtype(grad_dtype, wire):
    """ZeRO-0 all-reduce of n gradients over d = 8 ranks in a node, nothing hidden (no backward
    window): bus bytes 2 (d - 1)/d x wire x n over the node's bus bandwidth."""
    prof = load_profile("a100")
    job, lay = Job(M, 64, "bf16", grad_dtype=grad_dtype), _lay(0)
    x = _Ctx(job, lay, prof)
    n = stage_params(M, 1, 1, 0).total
    f = reduction_features(x, stage_params(M, 1, 1, 0), False)
    link = prof.spec.link(8, 1)
    assert f[COMM] == pytest.approx(2 * 7 / 8 * wire * n / link.bus_bytes_per_s, rel=1e-12)


def test_deepspeed_bf16_gradients_are_its_default():
    prof = load_profile("a100")
    base, bf16 = Job(M, 64, "bf16"), Job(M, 64, "bf16", grad_dtype="bf16")
    lay = _lay(1)
    assert step_time(bf16, lay, prof) == step_time(base, lay, prof)
    assert peak_memory(bf16, lay, prof.constants) == peak_memory(base, lay, prof.constants)


def test_bf16_gradients_need_a_bf16_model():
    job = dataclasses.replace(Job(M, 64, "fp16"), grad_dtype="bf16")
    with pytest.raises(InputError, match="bf16 gradients go with a bf16 model"):
        peak_memory(job, _lay(1), Constants())


def test_the_cli_prices_grad_dtype(capsys):
    from megatron.cli.plan import main
    argv = ["memory", "--model", "gpt3-1.3b", "--cluster", "a100", "--global-batch", "64",
            "--framework", "megatron-core", "--zero", "1", "--micro-batch", "8"]
    assert main(argv + ["--grad-dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "bf16 gradients" in out
    assert main(argv) == 0
    assert capsys.readouterr().out != out
