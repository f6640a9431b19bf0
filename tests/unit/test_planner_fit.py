"""planner/fit.py: the memory check megatron-train makes before it allocates anything. A failure
here localizes to the decision (fits / does not fit / unknown), the CPU memory it reads, or the
message a refused job gets; the check as a process: tests/integration/test_cli_train_fit.py."""
import os
import time

import pytest

from megatron.config import load_config
from megatron.planner import fit

from tests.support.frontier import FRONTIER, RECIPES, launch_nodes, ranks_per_node
from tests.support.paths import TINY

HUGE = ["model.hidden_size=16384", "model.num_layers=48", "model.num_attention_heads=128"]
GIB = 2 ** 30


def cpu(gb: float, ranks: int = 1) -> fit.DeviceMemory:
    return fit.cpu_memory(f"MemTotal: 99999999 kB\nMemAvailable: {int(gb * 2 ** 20)} kB\n", ranks)


def test_cpu_memory_is_mem_available_shared_by_the_ranks_on_the_node():
    mem = cpu(24, ranks=4)
    assert mem.kind == "cpu" and mem.bytes_per_rank == pytest.approx(6 * GIB)
    assert "MemAvailable 24.0 GB / 4 ranks on this node" == mem.source
    assert fit.cpu_memory("MemTotal: 1000 kB\n", 1) is None  # a kernel without the field


def test_tiny_fits_a_small_cpu_under_every_layout_of_up_to_four_ranks():
    for world, overrides in ((1, []), (2, ["parallel.tensor_parallel_size=2"]),
                             (4, ["parallel.pipeline_parallel_size=2", "parallel.zero_stage=0"]),
                             (4, ["parallel.zero_stage=3"])):
        v = fit.check(load_config(TINY, overrides), world, cpu(2, ranks=world))
        assert v.status == fit.FITS, (overrides, v)
        assert 0 < v.needed_gb < 0.5


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_frontier_recipes_fit_a_mi250x_gcd_at_their_launch_size(recipe):
    cfg = load_config(os.path.join(FRONTIER, recipe), [])
    world = launch_nodes(recipe) * ranks_per_node()
    v = fit.check(cfg, world, fit.DeviceMemory("gpu", 64 * GIB, "AMD Instinct MI250X"))
    assert v.status == fit.FITS, fit.misfit_message(cfg, v)
    # what the device must hold: the reserved figure, above the allocator's peak
    assert v.needed_bytes == v.stage.reserved_bytes > v.stage.peak_bytes


def test_a_huge_model_does_not_fit_and_the_message_names_prediction_memory_and_fixes():
    cfg = load_config(TINY, HUGE)
    v = fit.check(cfg, 1, cpu(24))
    assert v.status == fit.MISFIT and v.needed_gb > 1000
    msg = fit.misfit_message(cfg, v)
    for fragment in (f"{v.needed_gb:.1f} GB per rank", "154.64B parameters", "weights 576.1",
                     "optimizer states", "activations", "the CPU has 24.0 GB per rank",
                     "MemAvailable 24.0 GB / 1 rank", "parallel.tensor_parallel_size",
                     "parallel.pipeline_parallel_size", "parallel.zero_stage=3 (now 1)",
                     "training.activation_checkpointing=full", "training.micro_batch_size",
                     "megatron-plan memory"):
        assert fragment in msg, (fragment, msg)
    # model states dominate: splitting the model comes before recomputation
    assert msg.index("tensor_parallel_size") < msg.index("activation_checkpointing")


def test_activation_bound_jobs_list_recomputation_first():
    cfg = load_config(TINY, ["model.seq_length=16384", "model.num_attention_heads=4",
                             "training.micro_batch_size=16", "training.global_batch_size=16",
                             "model.attention_backend=math"])
    v = fit.check(cfg, 1, cpu(1))
    assert v.status == fit.MISFIT
    msg = fit.misfit_message(cfg, v)
    assert msg.index("activation_checkpointing=full") < msg.index("tensor_parallel_size")


def test_on_a_gpu_the_reserved_memory_is_compared_with_the_device():
    cfg = load_config(TINY, HUGE)
    v = fit.check(cfg, 1, fit.DeviceMemory("gpu", 140 * GIB, "NVIDIA H200, 140.0 GB"))
    assert v.status == fit.MISFIT and v.needed_bytes == v.stage.reserved_bytes
    assert "the GPU has 140.0 GB per rank (NVIDIA H200, 140.0 GB)" in fit.misfit_message(cfg, v)


def test_a_gpu_job_predicted_near_the_device_is_warned_that_the_verdict_is_uncertain():
    """At 80-110% of the device the planner's verdict is uncertain both ways
    (ranges.MARGIN_EVIDENCE): megatron-train starts a job predicted to fit there but logs
    the line; at 50%, on a CPU (constants measured here) or when refused, none."""
    cfg = load_config(TINY, HUGE)
    needed = fit.check(cfg, 1, fit.DeviceMemory("gpu", 1e15, "big")).needed_bytes

    def on(share, kind="gpu"):
        return fit.check(cfg, 1, fit.DeviceMemory(kind, needed / share, "test"))
    v = on(0.9)
    assert v.status == fit.FITS
    assert fit.edge_note(v).startswith("note on memory: predicted at 90% of the device, where "
                                       "the fit verdict is uncertain: of the 359 layouts")
    assert "a smaller training.micro_batch_size" in fit.edge_note(v)
    assert fit.edge_note(on(0.5)) == "" and fit.edge_note(on(0.9, "cpu")) == ""
    assert on(1.05).status == fit.MISFIT and fit.edge_note(on(1.05)) == ""


def test_what_the_planner_cannot_model_is_unknown_and_never_refused(monkeypatch):
    cfg = load_config(TINY, HUGE + ["parallel.pipeline_parallel_size=2",
                                    "parallel.pipeline_partition_method=parameters"])
    v = fit.check(cfg, 2, cpu(1))
    assert v.status == fit.UNKNOWN and "pipeline_partition_method=parameters" in v.reason

    def broken(*_):
        raise ZeroDivisionError("a case the model misses")
    monkeypatch.setattr(fit, "predict", broken)
    v = fit.check(load_config(TINY, HUGE), 1, cpu(1))
    assert v.status == fit.UNKNOWN and "a case the model misses" in v.reason


def test_the_check_is_cheap():
    """It runs on every start: well under a millisecond per call once imported."""
    cfg, mem = load_config(TINY, HUGE), cpu(24)
    started = time.perf_counter()
    for _ in range(100):
        fit.check(cfg, 1, mem)
    assert (time.perf_counter() - started) / 100 < 0.01


def test_check_memory_defaults_on_and_can_be_turned_off():
    assert load_config(TINY, []).training.check_memory is True
    assert load_config(TINY, ["training.check_memory=false"]).training.check_memory is False
