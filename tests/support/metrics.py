"""Metrics records made by hand for the tests of the writer and its readers."""
from megatron.base.records import StepRecord


def step_record(n: int, **values) -> StepRecord:
    """A training step's line with ordinary values; `values` replace any of them."""
    base = dict(step=n, loss=2.5, lr=1e-3, grad_norm=0.5, tokens_per_sec=100.0,
                tflops_per_gpu=1.0, mfu=None, mem_gb=0.1, loss_scale=None, skipped=False,
                step_time_s=0.2)
    return StepRecord(**{**base, **values})
