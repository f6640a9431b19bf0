"""The planner reads the DeepSpeed communication settings the trainer writes: the same function
(megatron.base.deepspeed_json.deepspeed_settings) with the config's deepspeed section carried
by the Job. A failure names which reader drifted: zero_settings (device, settings), the memory
model's bucket term (size, double buffer, dtype, ZeRO-3 reuse distance), the layout rules, or
the emitted config."""
import pytest

from megatron.config import load_config
from megatron.base.deepspeed_json import config_settings, deepspeed_config
from megatron.planner import zero_settings as zs
from megatron.planner.emit import layout_config
from megatron.planner.layout import Job, Layout, layout_problem
from megatron.planner.memory import peak_memory, stage_states
from megatron.planner.models import preset_model
from megatron.planner.params import stage_params
from megatron.planner.profile import Constants
from tests.support.paths import TINY

M13 = preset_model("gpt3-1.3b")
GPU, CPU = Constants(), Constants(bucket_touched=1.0)


def lay(**kw):
    base = dict(tp=1, pp=1, dp=8, micro_batch=1, grad_accum=8, zero=2, recompute="none",
                flash=True, sequence_parallel=False)
    base.update(kw)
    return Layout(**base)


def bucket_bytes(job, layout, c=GPU, device=None):
    sp = stage_params(job.model, layout.tp, layout.pp, 0)
    return stage_states(job, layout, sp, c, device).bucket


def test_profile_device():
    assert zs.device_of(GPU) == "gpu" and zs.device_of(CPU) == "cpu"


@pytest.mark.parametrize("overrides", [
    [], ["parallel.zero_stage=2"], ["parallel.zero_stage=3", "training.precision=bf16"],
    ["parallel.pipeline_parallel_size=2", "parallel.tensor_parallel_size=2"],
    ["parallel.zero_stage=2", "deepspeed.zero_optimization.reduce_bucket_size=3e6",
     "deepspeed.zero_optimization.overlap_comm=false", "deepspeed.communication_data_type=fp32"],
])
@pytest.mark.parametrize("device, torch_device", [("gpu", "cuda"), ("cpu", "cpu")])
@pytest.mark.parametrize("dp", [1, 2])
def test_planner_settings_equal_the_trainers(overrides, device, torch_device, dp):
    cfg = load_config(TINY, overrides)
    p = cfg.parallel
    job = Job(cfg.model, cfg.training.global_batch_size, cfg.training.precision,
              deepspeed=cfg.deepspeed)
    layout = Layout(p.tensor_parallel_size, p.pipeline_parallel_size, dp, 2, 8 // dp,
                    p.zero_stage)
    got = zs.settings_for(job, layout, device)
    assert got == config_settings(cfg, dp, torch_device)
    block = deepspeed_config(cfg, dp, torch_device)["zero_optimization"]
    assert {k: block[k] for k in got.zero_keys()} == got.zero_keys()


def test_gpu_zero12_double_the_bucket_and_cpu_or_pipelines_do_not():
    job = Job(M13, 64, "bf16")
    size = zs.settings_for(job, lay(), "gpu").reduce_bucket_size
    assert size == 12 * 2048 ** 2
    assert bucket_bytes(job, lay(zero=1)) == bucket_bytes(job, lay(zero=2)) == 2 * 2 * size
    assert bucket_bytes(job, lay(zero=3)) == 2 * size  # ZeRO-3: one buffer, overlap or not
    assert bucket_bytes(job, lay(zero=2), device="cpu") == 2 * 5e8  # one 5e8 bucket
    assert bucket_bytes(job, lay(zero=1, pp=2, dp=4, grad_accum=16)) == 2 * size  # no overlap
    assert bucket_bytes(job, lay(zero=0)) == 0
    # a ZeRO group of one rank reduces nothing: no bucket (deepspeed_json's module doc)
    assert bucket_bytes(job, lay(zero=1, tp=8, dp=1)) == bucket_bytes(job, lay(dp=1)) == 0
    assert bucket_bytes(job, lay(zero=3, dp=1)) == 2 * size


def test_the_jobs_deepspeed_section_reaches_the_memory_model():
    base = Job(M13, 64, "bf16")
    small = Job(M13, 64, "bf16", deepspeed={"zero_optimization": {"reduce_bucket_size": 10 ** 6}})
    assert bucket_bytes(small, lay()) == 2 * 2 * 10 ** 6
    assert peak_memory(small, lay(), GPU).peak_bytes < peak_memory(base, lay(), GPU).peak_bytes
    off = Job(M13, 64, "bf16", deepspeed={"zero_optimization": {"overlap_comm": False}})
    assert bucket_bytes(off, lay()) == bucket_bytes(base, lay()) / 2
    flat = Job(M13, 64, "bf16", deepspeed={"zero_optimization": {"contiguous_gradients": False}})
    assert bucket_bytes(flat, lay()) == 0
    fp32 = Job(M13, 64, "bf16", deepspeed={"communication_data_type": "fp32"})
    assert bucket_bytes(fp32, lay(zero=3)) == 2 * bucket_bytes(base, lay(zero=3))
    assert bucket_bytes(fp32, lay(zero=2)) == bucket_bytes(base, lay(zero=2))  # model dtype


def test_zero3_reuse_distance_is_read():
    layout = lay(zero=3)
    sp = stage_params(M13, 1, 1, 0)
    base = stage_states(Job(M13, 64, "bf16"), layout, sp, GPU)
    short = stage_states(Job(M13, 64, "bf16", deepspeed={"zero_optimization": {
        "stage3_max_reuse_distance": 0}}), layout, sp, GPU)
    # gathered: up to the reuse distance (default 1e9) plus the layer in use and the next one
    partition = 2 * sp.total / 8
    assert base.weights == pytest.approx(partition + 2 * min(sp.total, 1e9 + 2 * sp.max_layer))
    assert short.weights == pytest.approx(partition + 2 * 2 * sp.max_layer)


def test_cpu_profile_counts_touched_pages_only():
    job = Job(M13, 64, "bf16")
    assert bucket_bytes(job, lay(zero=2), CPU) == 0
    n = stage_params(M13, 1, 1, 0).total
    assert bucket_bytes(job, lay(zero=3), CPU) == 2 * min(5e8, n)


def test_overlap_claims_all_but_the_last_bucket():
    job = Job(M13, 64, "bf16")
    s = zs.settings_for(job, lay(), "gpu")
    n = stage_params(M13, 1, 1, 0).total
    assert zs.overlap_claim(s, 2, n) == pytest.approx(1 - s.reduce_bucket_size / n)
    assert zs.overlap_claim(s, 1, n) == zs.overlap_claim(s, 3, n) > 0.9
    assert zs.overlap_claim(s, 0, n) == 0
    assert zs.overlap_claim(zs.settings_for(job, lay(), "cpu"), 2, n) == 0
    assert zs.overlap_claim(s, 2, s.reduce_bucket_size // 2) == 0  # one bucket: nothing hides


def test_comm_bytes_follow_communication_data_type():
    job = Job(M13, 64, "bf16", deepspeed={"communication_data_type": "fp32"})
    assert zs.comm_bytes(zs.settings_for(job, lay(), "gpu"), 2) == 4
    assert zs.comm_bytes(zs.settings_for(Job(M13, 64, "bf16"), lay(), "gpu"), 2) == 2


def test_layouts_with_explicit_overlap_and_pipelining_are_refused():
    job = Job(M13, 64, "bf16", deepspeed={"zero_optimization": {"overlap_comm": True}})
    assert "overlap_comm" in layout_problem(job, lay(zero=1, pp=2, dp=4, grad_accum=16))
    assert layout_problem(job, lay(zero=1)) is None


def test_emitted_config_keeps_the_deepspeed_section(tmp_path):
    base = load_config(TINY, ["deepspeed.zero_optimization.reduce_bucket_size=4e6"])
    job = Job(base.model, 16, "fp32", deepspeed=base.deepspeed)
    cfg = layout_config(base, job, Layout(1, 2, 2, 2, 4, 1), flash_backend="sdpa")
    assert cfg.deepspeed == {"zero_optimization": {"reduce_bucket_size": 4_000_000}}
    path = tmp_path / "best.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(str(path)).deepspeed == cfg.deepspeed


def test_communication_dtype_sets_the_gradient_bytes_on_the_wire():
    from megatron.planner.profile import load_profile
    from megatron.planner.timing import step_time
    a100 = load_profile("a100")
    off = {"overlap_comm": False}
    layout = lay(zero=1, dp=64, grad_accum=4, micro_batch=2)
    times = {dt: step_time(Job(M13, 512, "bf16", deepspeed={
        "zero_optimization": off, **({"communication_data_type": dt} if dt else {})}),
        layout, a100).reduce_s for dt in (None, "bf16", "fp32")}
    assert times[None] == times["bf16"] < times["fp32"]


def test_bucket_elems_constant_overrides_the_runs_bucket(tmp_path, caplog):
    from megatron.planner.profile import load_profile
    job = Job(M13, 64, "bf16")
    assert bucket_bytes(job, lay(), Constants(bucket_elems=1e6)) == 2 * 2 * 1e6
    spec = "gpu_memory_gb: 80\npeak_tflops: 312\ngpus_per_node: 8\nintra_node_gbps: 300\n" \
           "inter_node_gbps: 200\n"
    follow = tmp_path / "follow.yaml"
    follow.write_text(spec + "constants:\n  bucket_elems: null\n")
    assert load_profile(str(follow)).constants.bucket_elems is None
    old = tmp_path / "old.yaml"
    old.write_text(spec + "constants:\n  bucket_elems: 500000000.0\n")
    assert load_profile(str(old)).constants.bucket_elems == 5e8
    assert "overrides the run's reduce_bucket_size" in caplog.text
