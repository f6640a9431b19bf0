"""A ZeRO group of one rank (base/deepspeed_json.py): overlap_comm and contiguous_gradients off,
so DeepSpeed's ZeRO-1 optimizer registers no per-parameter backward hook (ZeRO-2 keeps the hooks
that partition its gradients, without the bucket copy). In one fresh process, ZeRO-1 and ZeRO-2
runs of the tiny GPT with gradient accumulation, each with the new default and with
contiguous_gradients set back on: at ZeRO-1 the default registers no hook and the other a hook
per parameter, and at both stages the two train the same losses and gradient norms to the
bit."""
from tests.support.cli import script_result
from tests.support.paths import TINY

SCRIPT = r"""
import json, sys
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.launch import leave_distributed
from megatron.training.loop import train

hooks = []
original = DeepSpeedZeroOptimizer.create_gradient_handling_hooks
def counted(self):
    original(self)
    hooks.append(len(self._grad_acc_hooks))
DeepSpeedZeroOptimizer.create_gradient_handling_hooks = counted
out = {}
for zero in (1, 2):
    for contiguous in ("null", "true"):
        run = f"{sys.argv[1]}/{zero}{contiguous}"
        before = len(hooks)
        train(load_config(sys.argv[2], [
            f"run.dir={run}", "training.tensorboard=false", "training.train_iters=4",
            "training.precision=bf16", f"parallel.zero_stage={zero}",
            "training.global_batch_size=4", "training.micro_batch_size=2",
            f"deepspeed.zero_optimization.contiguous_gradients={contiguous}"]))
        rows = steps(read_metrics(RunDir(run).metrics))
        out[f"{zero}{contiguous}"] = {"loss": [r.loss for r in rows],
                                      "norm": [r.grad_norm for r in rows],
                                      "hooks": hooks[before:]}
leave_distributed()
print("RESULT " + json.dumps(out))
"""


def test_one_rank_registers_no_gradient_hook_and_trains_the_same_bits(tmp_path):
    out = script_result(SCRIPT, str(tmp_path), TINY)
    for zero in (1, 2):
        default, contiguous = out[f"{zero}null"], out[f"{zero}true"]
        assert len(contiguous["hooks"]) == 1 and contiguous["hooks"][0] > 10, contiguous
        assert default["hooks"] == ([] if zero == 1 else contiguous["hooks"]), (zero, default)
        assert len(default["loss"]) == 4
        assert (default["loss"], default["norm"]) == (contiguous["loss"], contiguous["norm"]), \
            (zero, default, contiguous)
