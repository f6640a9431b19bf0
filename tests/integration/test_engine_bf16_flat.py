"""engine/bf16_flat.py: BF16_Optimizer's gradient norm and clipping over its flat fp32 buffers
(training.grad_accum_dtype=fp32, one tensor-parallel rank, one stage) against DeepSpeed's own
per-tensor ones, in one fresh process: the same norms (to rounding: the sum's order differs)
and the same losses over steps that clip, and the flat path is the one taken."""
from tests.support.cli import script_result
from tests.support.paths import TINY

SCRIPT = r"""
import json, sys
from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.engine import bf16_flat
from megatron.launch import leave_distributed
from megatron.training.loop import train

taken = []
original = bf16_flat.use_flat_buffers
bf16_flat.use_flat_buffers = lambda opt, tp, pp: taken.append(original(opt, tp, pp))
out = {}
for flat in (True, False):
    bf16_flat.ENABLED = flat
    run = f"{sys.argv[1]}/{flat}"
    # clip 0.05: every step is clipped, so the scaling runs too
    train(load_config(sys.argv[2], [f"run.dir={run}", "training.tensorboard=false",
                                    "training.train_iters=5", "training.precision=bf16",
                                    "parallel.zero_stage=1", "training.grad_accum_dtype=fp32",
                                    "training.clip_grad=0.05", "training.global_batch_size=4",
                                    "training.micro_batch_size=2"]))
    rows = steps(read_metrics(RunDir(run).metrics))
    out[str(flat)] = {"loss": [r.loss for r in rows], "norm": [r.grad_norm for r in rows]}
out["taken"] = taken
leave_distributed()
print("RESULT " + json.dumps(out))
"""


BOUND = 1e-3


def test_flat_norm_and_clipping_match_deepspeeds_per_tensor_ones(tmp_path):
    out = script_result(SCRIPT, str(tmp_path), TINY, timeout=300)
    assert out["taken"] == [True, False], out["taken"]  # flat, then DeepSpeed's own
    flat, own = out["True"], out["False"]
    assert len(flat["norm"]) == len(own["norm"]) == 5
    assert all(n > 0.05 for n in own["norm"]), own["norm"]  # every step was clipped
    # Step 1: the same gradients, so the norms differ by the sum's rounding only. After it the
    # clip coefficients differ in their last bits, which bf16 weights round apart: a wrong norm
    # (a tensor counted twice or left out) or a skipped scaling (an update 20x too large)
    # differs by orders more than BOUND.
    assert flat["loss"][0] == own["loss"][0]
    assert abs(flat["norm"][0] - own["norm"][0]) <= 1e-5 * own["norm"][0], (flat, own)
    for key in ("norm", "loss"):
        for a, b in zip(flat[key], own[key]):
            assert abs(a - b) <= BOUND * abs(b), (key, flat[key], own[key])
