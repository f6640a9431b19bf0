"""engine/zero_norm.py: DeepSpeed's ZeRO 1-2 gradient norm taken with torch._foreach_norm in
DeepSpeed's norm dtype instead of one copy and one norm per tensor. In one fresh process, ZeRO-1
and ZeRO-2 runs that clip every step, each both ways: the same norms and losses to the bit on
the CPU (where both reduce each tensor alike), and the multi-tensor path is the one taken."""
from tests.support.cli import script_result
from tests.support.paths import TINY

SCRIPT = r"""
import json, sys
from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.engine import zero_norm
from megatron.launch import leave_distributed
from megatron.training.loop import train

taken = []
original = zero_norm.use_foreach_norm
zero_norm.use_foreach_norm = lambda opt: taken.append(original(opt)) or taken[-1]
out = {}
for zero in (1, 2):
    for on in (True, False):
        zero_norm.ENABLED = on
        run = f"{sys.argv[1]}/{zero}{on}"
        # clip 0.05: every step is clipped, so the norm sets every update
        train(load_config(sys.argv[2], [
            f"run.dir={run}", "training.tensorboard=false", "training.train_iters=5",
            "training.precision=bf16", f"parallel.zero_stage={zero}", "training.clip_grad=0.05",
            "training.global_batch_size=4", "training.micro_batch_size=2"]))
        rows = steps(read_metrics(RunDir(run).metrics))
        out[f"{zero}{on}"] = {"loss": [r.loss for r in rows], "norm": [r.grad_norm for r in rows]}
out["taken"] = taken
leave_distributed()
print("RESULT " + json.dumps(out))
"""


def test_the_multi_tensor_norm_is_deepspeeds_to_the_bit(tmp_path):
    out = script_result(SCRIPT, str(tmp_path), TINY)
    assert out["taken"] == [True, False, True, False], out["taken"]
    for zero in (1, 2):
        foreach, own = out[f"{zero}True"], out[f"{zero}False"]
        assert len(own["norm"]) == 5 and all(n > 0.05 for n in own["norm"]), own
        assert foreach == own, (zero, foreach, own)
