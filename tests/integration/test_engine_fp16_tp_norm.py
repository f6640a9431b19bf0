"""engine/zero0_norm.mark_gradients under fp16 at TP 2: DeepSpeed's FP16_UnfusedOptimizer (the
ZeRO-0 16-bit optimizer) on two CPU ranks with its dynamic loss scale. The trainer refuses fp16
on a CPU (DeepSpeed's CPU accelerator has no fp16 engine), so this drives the optimizer itself,
as the engine builds it: the project's TP marks (parallel/layers.mark_tp, then
engine/model.mark_tensor_parallel), its mpu over a TP 2 ParallelState, and the engine's two
wrappers. Gradients are set to a known tensor times the loss scale, so every expected figure is
computed here from the unsharded gradient:

- the norm the step takes, over the loss scale, is the norm of the whole gradient (each TP
  rank's shard once, the replicated bias once); DeepSpeed's own, unwrapped, leaves rank 1's
  shard out;
- clipping to 1.0 (plain SGD at lr 1, so the update is the clipped gradient) moves the weights
  by exactly the clipped gradient;
- an infinity in rank 1's shard alone skips the step on both ranks and halves the loss scale on
  both, the weights untouched (the overflow pass is kept beyond one TP rank:
  engine/overflow_check.py)."""
import pytest

from tests.support.procs import spawn_json

SCALE = 2.0 ** 8


def _optimizer(params, mpu, clip):
    import torch
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer
    return FP16_UnfusedOptimizer(torch.optim.SGD(params, lr=1.0), mpu=mpu, clip_grad=clip,
                                 dynamic_loss_scale=True,
                                 dynamic_loss_args={"init_scale": SCALE, "scale_window": 1000,
                                                    "min_scale": 1, "delayed_shift": 1},
                                 verbose=False)


def _worker(rank, out_dir):
    import torch
    from megatron.engine import overflow_check, zero0_norm
    from megatron.engine.engine import join_deepspeed
    from megatron.engine.model import mark_tensor_parallel
    from megatron.engine.mpu import DeepSpeedMPU
    from megatron.parallel.layers import mark_tp
    from megatron.parallel.state import ParallelState

    join_deepspeed()  # as the engine joins it: no DeepSpeed op is built
    state = ParallelState.build(2, 1)
    mpu = DeepSpeedMPU(state)
    gen = torch.Generator().manual_seed(7)
    weight_full, grad_full = torch.randn(8, 4, generator=gen), torch.randn(8, 4, generator=gen)
    bias, bias_grad = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    rows = slice(4 * rank, 4 * rank + 4)

    def model():
        module = torch.nn.Module()
        module.weight = mark_tp(torch.nn.Parameter(weight_full[rows].clone().half()), 0)
        module.bias = torch.nn.Parameter(bias.clone().half())
        mark_tensor_parallel(module)
        return module

    def set_grads(module, poison=False):
        g = (grad_full[rows] * SCALE).half()
        if poison and rank == 1:
            g[0, 0] = float("inf")
        module.weight.grad = g
        module.bias.grad = (bias_grad * SCALE).half()

    out = {}
    for wrapped in (True, False):
        module = model()
        opt = _optimizer(list(module.parameters()), mpu, clip=1.0)
        out[f"marked{wrapped}"] = zero0_norm.mark_gradients(opt, 2) if wrapped else False
        out[f"norm_check{wrapped}"] = overflow_check.use_norm_check(opt, 2, 1)
        set_grads(module)
        before = [p.detach().float().clone() for p in module.parameters()]
        overflow = opt.step()
        out[f"overflow{wrapped}"] = bool(overflow)
        out[f"norm{wrapped}"] = float(opt._global_grad_norm) / SCALE
        moved = [(b - p.detach().float()) for b, p in zip(before, module.parameters())]
        out[f"update_sq{wrapped}"] = [float(moved[0].pow(2).sum()), float(moved[1].pow(2).sum())]
        if wrapped:
            set_grads(module, poison=True)
            kept = [p.detach().clone() for p in module.parameters()]
            out["poisoned_overflow"] = bool(opt.step())
            out["scale_after"] = float(opt.loss_scale_config.cur_scale)
            out["untouched"] = all(torch.equal(k, p.detach())
                                   for k, p in zip(kept, module.parameters()))
    # the expected figures, from the whole gradient as the optimizer saw it (fp16-rounded)
    seen = (grad_full * SCALE).half().float() / SCALE
    seen_bias = (bias_grad * SCALE).half().float() / SCALE
    out["true_norm"] = float((seen.pow(2).sum() + seen_bias.pow(2).sum()).sqrt())
    out["rank0_only_norm"] = float((seen[:4].pow(2).sum() + seen_bias.pow(2).sum()).sqrt())
    return out


@pytest.mark.slow
def test_fp16_zero0_norm_clip_and_overflow_count_every_tp_rank(tmp_path):
    pytest.importorskip("deepspeed")
    ranks = spawn_json(_worker, str(tmp_path))
    for rank, got in enumerate(ranks):
        where = f"rank {rank}: {got}"
        assert got["markedTrue"] is True and got["norm_checkTrue"] is None, where
        assert not got["overflowTrue"] and not got["overflowFalse"], where
        true, partial = got["true_norm"], got["rank0_only_norm"]
        assert abs(got["normTrue"] - true) <= 1e-5 * true, where
        # DeepSpeed's own norm: rank 1's shard left out (0.752 for 0.873 in the tiny GPT)
        assert abs(got["normFalse"] - partial) <= 1e-5 * partial and partial < 0.9 * true, where
        # clipped to 1.0: the whole update (both weight shards, the bias once, which moves
        # alike on both ranks) has norm 1
        total_sq = sum(r["update_sqTrue"][0] for r in ranks) + got["update_sqTrue"][1]
        assert abs(total_sq - 1.0) <= 2e-3, where
        assert got["poisoned_overflow"] is True and got["untouched"] is True, where
        assert got["scale_after"] == 128.0, where
    assert ranks[0]["update_sqTrue"][1] == ranks[1]["update_sqTrue"][1]
