"""engine/overflow_check.py: DeepSpeed's ZeRO-1 optimizer and its FP16_UnfusedOptimizer (ZeRO-0)
tell a step with a non-finite gradient from the gradient norm alone, without their own pass over
every gradient. In one fresh process, each run both ways, with a NaN put into one weight's gradient
on step 3: that step is skipped both ways (and counted as skipped), the weights come through
it finite, and every step is the same to the bit (losses, norms), so the pass found nothing
the norm did not. fp16 runs on a GPU only: its loss scale backing off at an overflow, with the
norm's verdict, is tests/gpu/test_training_gpu.py's."""
import json

from tests.support.cli import script_result
from tests.support.paths import TINY

# (precision, ZeRO stage, the DeepSpeed optimizer the check is taken from)
CASES = [("bf16", 1, "DeepSpeedZeroOptimizer"), ("bf16", 0, "FP16_UnfusedOptimizer")]

SCRIPT = r"""
import json, sys
from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.engine import overflow_check
from megatron.launch import leave_distributed
from megatron.training.loop import train

taken, calls = [], [0]
original = overflow_check.use_norm_check


def poisoned(grad):
    calls[0] += 1
    # two micro-batches a step: the first backward of step 3
    return grad * float("nan") if calls[0] == 5 else grad


def wrapped(opt, tp, pp):
    calls[0] = 0
    groups = getattr(opt, "bit16_groups", None) or opt.fp16_groups
    groups[0][0].register_hook(poisoned)
    taken.append(original(opt, tp, pp))
    return taken[-1]


overflow_check.use_norm_check = wrapped
out = {}
for precision, zero in json.loads(sys.argv[3]):
    for on in (True, False):
        overflow_check.ENABLED = on
        run = f"{sys.argv[1]}/{precision}{zero}{on}"
        cfg = load_config(sys.argv[2], [
            f"run.dir={run}", "training.tensorboard=false", "training.train_iters=6",
            f"training.precision={precision}", f"parallel.zero_stage={zero}",
            "training.global_batch_size=4", "training.micro_batch_size=2"])
        train(cfg)
        rows = steps(read_metrics(RunDir(run).metrics))
        out[f"{precision}{zero}{on}"] = {
            "loss": [r.loss for r in rows], "norm": [r.grad_norm for r in rows],
            "skipped": [r.skipped for r in rows]}
out["taken"] = taken
leave_distributed()
print("RESULT " + json.dumps(out))
"""


def test_a_non_finite_gradient_is_skipped_from_the_norm_alone_and_nothing_else_moves(tmp_path):
    cases = json.dumps([[p, z] for p, z, _ in CASES])
    out = script_result(SCRIPT, str(tmp_path), TINY, cases)
    # each case: the norm alone (the optimizer it was taken from), then DeepSpeed's own pass
    assert out["taken"] == [x for _, _, kind in CASES for x in (kind, None)], out["taken"]
    for precision, zero, _ in CASES:
        norm_only, own = out[f"{precision}{zero}True"], out[f"{precision}{zero}False"]
        assert own["skipped"] == [False, False, True, False, False, False], (precision, own)
        assert norm_only == own, (precision, zero, norm_only, own)
        # the skipped step left the weights finite: the losses after it are numbers
        assert all(isinstance(v, float) for v in own["loss"][3:]), (precision, zero, own)
