"""megatron-plan as a person uses it: help, tables, files, and one-line errors without a
traceback. Failures point at megatron/cli/plan*.py."""
import pytest

from megatron.cli.plan import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_search_prints_a_table_and_writes_files(capsys, tmp_path):
    cfg, sbatch = tmp_path / "best.yaml", tmp_path / "best.sbatch"
    code, out, _ = run(capsys, "search", "--model", "gpt3-1.3b", "--cluster", "a100", "--nodes",
                       "1", "--global-batch", "64", "--top", "3", "--out-config", str(cfg),
                       "--out-sbatch", str(sbatch))
    assert code == 0
    assert "TFLOPs/GPU" in out and "bubble %" in out
    assert cfg.exists() and "python -m megatron.cli.train --config" in sbatch.read_text()


def test_memory_of_the_paper_recipe(capsys):
    code, out, _ = run(capsys, "memory", "--model", "175b", "--cluster", "frontier", "--nodes",
                       "16", "--global-batch", "1280", "--tp", "4", "--pp", "16", "--zero", "1",
                       "--recompute", "full")
    assert code == 0
    assert "fits" in out and "bubble 2.3%" in out


F = ("--cluster", "frontier")


@pytest.mark.parametrize("argv,needle", [
    (("search", "--model", "9b", *F), "--model='9b' is invalid"),
    (("search", *F), "name the model"),
    (("search", "--model", "175b", "--cluster", "nowhere.yaml"), "nowhere.yaml"),
    (("search", "--config", "missing.yaml", *F), "missing.yaml"),
    (("search", "--model", "175b", "--micro-batches", "1,x", *F), "--micro-batches"),
    (("search", "--model", "175b", "--lighter-ends", "0,-1", *F), "--lighter-ends='0,-1'"),
    (("memory", "--model", "175b", "--tp", "3", *F), "--tp x --pp"),
    (("memory", "--model", "175b", "--nodes", "16", "--tp", "8", "--pp", "3", *F), "--tp x --pp"),
    (("search", "--model", "1t", "--nodes", "1", *F), "no layout of 8 devices fits"),
    (("scaling", "--model", "175b", "--nodes", "16,x", *F), "--nodes"),
    # --cluster has no default (it was frontier, silently)
    (("search", "--model", "175b"), "name the cluster: --cluster"),
    (("memory", "--model", "175b", "--nodes", "16"), "there is no default"),
    (("scaling", "--model", "175b", "--nodes", "16,32"), "name the cluster"),
    # a layout the named engine cannot run (Megatron-LM has no ZeRO-3, FSDP no ZeRO-1)
    (("memory", "--model", "22b", "--cluster", "a100", "--tp", "8", "--zero", "3",
      "--framework", "megatron-lm"), "Megatron-LM has no ZeRO-2 or 3"),
    (("memory", "--model", "22b", "--cluster", "a100", "--nodes", "2", "--pp", "2", "--zero",
      "1", "--framework", "fsdp"), "pick --zero 2 or 3"),
    # a micro-batch group without model chunks: the trainer refuses it, so the planner does
    # (it was priced as if grouped)
    (("memory", "--model", "22b", "--cluster", "a100", "--nodes", "2", "--pp", "2",
      "--microbatch-group", "5"), "parallel.pipeline_microbatch_group=5 is invalid: expected 0 "
                                  "without model chunks"),
])
def test_bad_input_is_one_clear_line(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle in err and "Traceback" not in err
    assert err.strip().count("\n") == 0


def test_bad_cluster_file_names_the_field(capsys, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("gpu_memory_gb: 64\npeak_tflops: fast\ngpus_per_node: 8\n"
                    "intra_node_gbps: 50\ninter_node_gbps: 100\n")
    code, _, err = run(capsys, "search", "--model", "22b", "--cluster", str(path))
    assert code == 2 and "cluster.peak_tflops" in err


@pytest.mark.parametrize("constant,expected", [
    ("comm_eff: 0", "constants.comm_eff=0 is invalid: expected an efficiency above 0"),
    ("gemm_eff: .nan", "constants.gemm_eff=nan is invalid: expected a finite number >= 0"),
    ("pipe_layer_s: .inf", "constants.pipe_layer_s=inf is invalid"),
    ("dp_overlap: 1.5", "constants.dp_overlap=1.5 is invalid: expected a share in [0, 1]"),
    ("moe_imbalance: 0.5", "constants.moe_imbalance=0.5 is invalid: expected a ratio >= 1"),
])
def test_a_constant_outside_its_domain_is_refused_by_name(capsys, tmp_path, constant,
                                                          expected):
    """0 for an efficiency was a ZeroDivisionError traceback; NaN passed `value < 0` and priced
    every layout at NaN."""
    path = tmp_path / "c.yaml"
    path.write_text(f"base: frontier\nconstants:\n  {constant}\n")
    code, _, err = run(capsys, "memory", "--model", "22b", "--cluster", str(path), "--tp", "8")
    assert code == 2 and expected in err and "Traceback" not in err, err


def test_cluster_file_is_used(capsys, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: mine\ngpu_memory_gb: 80\npeak_tflops: 300\ngpus_per_node: 4\n"
                    "intra_node_gbps: 200\ninter_node_gbps: 50\nconstants: {gemm_eff: 0.5}\n")
    code, out, _ = run(capsys, "search", "--model", "gpt3-1.3b", "--cluster", str(path),
                       "--nodes", "2", "--global-batch", "64", "--top", "2")
    assert code == 0 and "cluster: mine, 2 node(s) x 4 = 8 devices" in out


def test_scaling_table_and_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs the 'plan' extra (matplotlib)")
    png = tmp_path / "scaling.png"
    code, out, _ = run(capsys, "scaling", "--model", "175b", "--cluster", "frontier",
                       "--nodes", "16,32,64,128",
                       "--global-batch", "1280", "--tp", "4", "--pp", "16", "--recompute",
                       "full", "--plot", str(png))
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "weak" in out and "strong" in out


# An 18B GPT laid out as large A100 runs lay it out: TP8 in a node, ZeRO-0, full recompute, the
# math attention path, micro-batch 1.
LAYOUT_18B = """\
model: {num_layers: 40, hidden_size: 6144, num_attention_heads: 48, seq_length: 2048,
        vocab_size: 51200, attention_backend: math}
parallel: {tensor_parallel_size: 8, pipeline_parallel_size: 1, zero_stage: 0}
training: {micro_batch_size: 1, global_batch_size: 1024, precision: bf16,
           activation_checkpointing: full}
"""


def test_memory_uses_the_layout_the_config_sets(capsys, tmp_path):
    path = tmp_path / "18b.yaml"
    path.write_text(LAYOUT_18B)
    code, out, _ = run(capsys, "memory", "--config", str(path), "--cluster", "a100",
                       "--nodes", "32")
    assert code == 0
    assert f"layout: tp8-pp1-dp32-mb1-ga32-z0-full-noflash (from {path})" in out
    assert "DOES NOT FIT" not in out and ": fits" in out
    # where the step goes: every term, TP8's collectives inside the node, no pipeline to fill
    table = out.split("where the step goes")[1].split("predicted step")[0]
    for term in ("compute", "collectives in a node", "pipeline fill and drain",
                 "gradient reduction + optimizer"):
        assert term in table, term
    fill = next(line for line in table.splitlines() if "pipeline fill and drain" in line)
    assert fill.split()[4:6] == ["0", "0.0%"]


def test_a_layout_flag_overrides_the_config_and_says_so(capsys, tmp_path):
    path = tmp_path / "18b.yaml"
    path.write_text(LAYOUT_18B)
    code, out, _ = run(capsys, "memory", "--config", str(path), "--cluster", "a100",
                       "--nodes", "32", "--pp", "2", "--recompute", "full", "--flash")
    assert code == 0
    # --recompute full equals the config's value: only the changed flags are named
    assert (f"layout: tp8-pp2-dp16-mb1-ga64-z0-full-flash (from {path}; --pp, --flash from "
            "the command line)") in out


def test_scaling_uses_the_layout_the_config_sets(capsys, tmp_path):
    path = tmp_path / "18b.yaml"
    path.write_text(LAYOUT_18B)
    code, out, _ = run(capsys, "scaling", "--config", str(path), "--cluster", "a100",
                       "--nodes", "32,64", "--mode", "weak")
    assert code == 0 and "layout at 32 node(s): tp8-pp1-dp32-mb1-ga32-z0-full-noflash" in out


def test_search_reports_where_the_config_layout_ranks(capsys, tmp_path):
    path = tmp_path / "18b.yaml"
    path.write_text(LAYOUT_18B)
    # a narrowed space that still holds the config's layout (the whole space is 20 s)
    code, out, _ = run(capsys, "search", "--config", str(path), "--cluster", "a100",
                       "--nodes", "32", "--top", "3", "--pp-values", "1,2",
                       "--micro-batches", "1,2", "--zero-stages", "0,1")
    assert code == 0
    assert f"the layout {path} sets, tp8-pp1-dp32-mb1-ga32-z0-full-noflash, ranks " in out
    # and why it is behind the best: the step terms that differ most, with their seconds
    gap = out.split("longer than the best's (")[1]
    assert "); the terms that differ most: +" in gap and " s compute" in gap


def test_memory_prices_the_interleaved_schedule_and_says_how_the_trainer_runs_it(capsys):
    """--interleave prices Megatron-LM's schedule and names the trainer's settings for it."""
    base = ("memory", "--model", "175b", "--cluster", "frontier", "--nodes", "16",
            "--global-batch", "1280", "--tp", "4", "--pp", "16", "--recompute", "full")
    code, plain, _ = run(capsys, *base)
    assert code == 0 and "interleaved" not in plain
    code, out, _ = run(capsys, *base, "--interleave", "2")
    assert code == 0
    assert "-v2" in out and "parallel.pipeline_schedule=interleaved" in out
    assert "bubble 1.2%" in out  # 15 / (2 x 640 + 15)
    code, _, err = run(capsys, *base, "--interleave", "5")
    assert code == 2 and "set model.num_layers to a multiple of 80" in err


def test_an_interleaved_layout_is_written_as_the_trainers_interleaved_schedule():
    """Megatron-LM's interleaved 1F1B (1f1b with chunks) is the trainer's interleaved schedule
    with virtual_pipeline_size; a layout the trainer refuses with chunks (ZeRO-0) is refused
    by the trainer's own rule."""
    from megatron.config import Config
    from megatron.config.errors import ConfigError
    from megatron.planner.emit import layout_config
    from megatron.planner.layout import Job, Layout
    from megatron.planner.models import preset_model
    job = Job(preset_model("175b"), 1280)
    cfg = layout_config(Config(), job, Layout(4, 16, 2, 1, 640, interleave=2))
    p = cfg.parallel
    assert (p.pipeline_schedule, p.virtual_pipeline_size) == ("interleaved", 2)
    with pytest.raises(ConfigError, match="zero_stage"):
        layout_config(Config(), job, Layout(4, 16, 2, 1, 640, zero=0, interleave=2))


# --- cluster files derived from a preset (`base:`, issue 26 items 3 and 4) ---

def _derived(tmp_path, text):
    path = tmp_path / "derived.yaml"
    path.write_text(text)
    return str(path)


def test_a_file_naming_only_its_base_is_the_preset(capsys, tmp_path):
    path = _derived(tmp_path, "base: h100\n")
    argv = ["memory", "--model", "175b", "--nodes", "16", "--global-batch", "1536", "--tp", "8",
            "--pp", "8", "--recompute", "full"]
    code_p, out_p, _ = run(capsys, *argv, "--cluster", "h100")
    code_f, out_f, _ = run(capsys, *argv, "--cluster", path)
    assert code_p == code_f == 0 and out_p == out_f


def test_a_derived_file_changes_only_the_fields_it_lists(tmp_path):
    import dataclasses
    from megatron.planner.layout import Job, Layout
    from megatron.planner.memory import peak_memory
    from megatron.planner.models import preset_model
    from megatron.planner.profile import Profile, load_profile
    from megatron.planner.timing import step_time
    path = _derived(tmp_path, "base: a100-40gb\ninter_node_gbps: 100\n"
                              "constants: {pipe_engine_share: 0}\n")
    preset, derived = load_profile("a100-40gb"), load_profile(path)
    expected = Profile(dataclasses.replace(preset.spec, inter_node_gbps=100),
                       preset.constants.replace(pipe_engine_share=0.0))
    assert derived == expected
    job = Job(preset_model("gpt3-6.7b"), 512, "bf16")
    lay = Layout(4, 2, 16, 1, 32, zero=1, recompute="full")
    assert step_time(job, lay, derived) == step_time(job, lay, expected)
    assert peak_memory(job, lay, derived.constants, "gpu") == \
        peak_memory(job, lay, preset.constants, "gpu")
    # the changed fields do change the prediction (DP 16 of TP 4 ranks crosses nodes)
    assert step_time(job, lay, derived).step_s > step_time(
        job, lay, Profile(preset.spec, expected.constants)).step_s
    assert step_time(job, lay, derived).step_s != step_time(job, lay, preset).step_s


def test_pipe_engine_share_zero_on_a_base_reproduces_the_megatron_lm_pricing(tmp_path):
    """docs/planner.md: `base: PRESET` with `framework: megatron-lm-2021` and
    `constants: {pipe_engine_share: 0, pipe_layer_s: 0}` prices a run as
    validation.in_sample_profile prices
    Megatron-LM's own runs of 2021 (the constants the file leaves out are the preset's, not the
    generic defaults); without the framework it is this trainer's pricing, which hides the
    column-parallel layers' backward collectives under their weight gradients."""
    from megatron.planner.profile import load_profile
    from megatron.planner.timing import step_time
    from megatron.planner.validation import in_sample_profile, load_cases
    case = next(c for c in load_cases() if c.id == "ptdp-175b-384")
    derived = load_profile(_derived(tmp_path, "base: a100\nframework: megatron-lm-2021\n"
                                              "constants: {pipe_engine_share: 0, "
                                              "pipe_layer_s: 0}\n"))
    assert step_time(case.job, case.layout, derived).step_s == \
        step_time(case.job, case.layout, in_sample_profile(case)).step_s
    trainer = load_profile(_derived(tmp_path, "base: a100\nconstants: {pipe_engine_share: 0, "
                                              "pipe_layer_s: 0}\n"))
    assert step_time(case.job, case.layout, trainer).step_s < \
        step_time(case.job, case.layout, derived).step_s


def test_an_unknown_base_is_one_clear_line(capsys, tmp_path):
    path = _derived(tmp_path, "base: a100-20gb\n")
    code, _, err = run(capsys, "search", "--model", "22b", "--cluster", path, "--nodes", "1")
    assert code == 2 and "base" in err and "a100-40gb" in err and "Traceback" not in err


def test_framework_flag_and_cluster_field_select_the_overlap(capsys, tmp_path):
    argv = ["memory", "--model", "175b", "--nodes", "16", "--global-batch", "1536", "--tp", "8",
            "--pp", "8", "--sp", "--recompute", "selective"]
    _, ds, _ = run(capsys, *argv, "--cluster", "h100")
    _, core, _ = run(capsys, *argv, "--cluster", "h100", "--framework", "megatron-core")
    path = _derived(tmp_path, "base: h100\nframework: megatron-core\n")
    _, from_file, _ = run(capsys, *argv, "--cluster", path)
    step = [line for line in core.splitlines() if line.startswith("step ")]
    assert step and step == [line for line in from_file.splitlines() if line.startswith("step ")]
    assert step != [line for line in ds.splitlines() if line.startswith("step ")]
    code, _, err = run(capsys, *argv, "--cluster", _derived(tmp_path, "base: h100\nframework: x\n"))
    assert code == 2 and "cluster.framework" in err


def test_a_config_without_the_backward_tp_overlap_is_priced_with_it_exposed(capsys):
    """parallel.tp_backward_overlap=false runs this trainer's column-parallel layers with the
    backward's collective before the weight gradient: `memory --config` prices it as
    megatron-deepspeed (every TP collective exposed), slower at TP 4; with the default it is
    priced as this trainer, hiding them."""
    import re
    argv = ["memory", "--config", "examples/frontier/175b.yaml", "--cluster", "frontier",
            "--nodes", "16"]
    steps = {}
    for label, extra in (("on", []), ("off", ["--set", "parallel.tp_backward_overlap=false"]),
                         ("paper", ["--framework", "megatron-deepspeed"])):
        code, out, _ = run(capsys, *argv, *extra)
        assert code == 0
        steps[label] = float(re.search(r"^step ([0-9.]+) s", out, re.M).group(1))
    assert steps["off"] == steps["paper"] > steps["on"]


def test_every_preset_is_named_where_the_cli_lists_them(capsys):
    """The presets the help, the missing --cluster error and --fp8's help name come from the
    preset table (hardware.PRESETS), so a preset added there is offered everywhere: mi325x,
    the MI300X's chip with 256 GB at 6 TB/s, among them, and the trainer's MFU finds its peak
    by the device's name."""
    import dataclasses
    from megatron.config import devices
    from megatron.planner.hardware import PRESETS
    from megatron.planner.profile import load_profile
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    out = capsys.readouterr().out.replace("\n", " ")
    code, _, err = run(capsys, "memory", "--model", "175b", "--nodes", "1",
                       "--global-batch", "8")
    assert code == 2
    for name in PRESETS:
        assert name in out and name in err, name
    mi325x, mi300x = PRESETS["mi325x"], PRESETS["mi300x"]
    assert (mi325x.gpu_memory_gb, mi325x.hbm_gbps) == (256, 6000)
    assert dataclasses.replace(mi325x, name="mi300x", gpu_memory_gb=192,
                               hbm_gbps=5300) == mi300x
    assert load_profile("mi325x").constants == load_profile("mi300x").constants
    assert devices.lookup(devices.PEAK_TFLOPS, "AMD Instinct MI325X") == 1307.0
    assert devices.lookup(devices.PEAK_FP8_TFLOPS, "AMD Instinct MI325X") == 2614.9


def test_scaling_best_refuses_layout_flags_it_would_ignore(capsys):
    """scaling --best searches its own layout: a layout flag beside it used to be dropped
    without a word (the table showed TP 1 for --tp 4). Refused by name, nothing printed."""
    base = ("scaling", "--nodes", "4,8", "--model", "gpt3-13b", "--cluster", "a100",
            "--global-batch", "512", "--best")
    code, out, err = run(capsys, *base, "--tp", "4", "--zero", "2")
    assert code == 2 and out == ""
    assert "--tp, --zero would be ignored: drop them, or drop --best" in err
    code, out, err = run(capsys, *base, "--no-flash")
    assert code == 2 and "--no-flash would be ignored: drop it" in err
    code, out, _ = run(capsys, *base)
    assert code == 0 and "layout at 4 node(s): tp" in out


def test_every_planner_module_is_in_the_module_table_of_docs_planner():
    """docs/planner.md's module table names each file of megatron/planner/, so a new module is
    described where the planner's reader looks (six were missing until December 2026)."""
    from pathlib import Path
    from tests.support.paths import ROOT
    doc = Path(ROOT, "docs", "planner.md").read_text()
    table = doc[doc.index("| module | what it holds |"):doc.index("The layout rules (TP divides")]
    modules = sorted(p.name for p in Path(ROOT, "megatron", "planner").glob("*.py")
                     if p.name != "__init__.py")
    assert [m for m in modules if f"`{m}`" not in table] == []


def test_scaling_says_how_sure_it_is_about_memory_and_scale(capsys):
    """scaling prints the notes memory and search print: a point reserved at 80-100% of the
    device says its share in the note column and the margin line follows the table; a
    projection reaching 4096 devices gets the scale note, counted over the points that have a
    layout (the strong point at 4096 has none: 64 sequences do not split over DP 4096)."""
    from megatron.cli.plan import main
    args = ["scaling", "--model", "gpt3-6.7b", "--cluster", "a100", "--global-batch", "64",
            "--tp", "1", "--pp", "1", "--zero", "1", "--recompute", "none", "--micro-batch", "4"]
    assert main([*args, "--nodes", "1,2,512", "--mode", "weak"]) == 0
    out = capsys.readouterr().out
    assert "98% of device memory" in out and "note on scale: at 4096 devices or more" in out
    assert "note on memory: the layout is reserved at 98% of the device" in out
    assert "a smaller --micro-batch" in out
    assert main([*args, "--nodes", "1,2,512", "--mode", "strong"]) == 0
    assert "note on scale" not in capsys.readouterr().out   # its 4096-device point: no layout
    assert main([*args[:-1], "2", "--nodes", "1,2", "--mode", "weak"]) == 0
    out = capsys.readouterr().out
    assert "of device memory" not in out and "note on memory" not in out


@pytest.mark.parametrize("argv,needle", [
    # past any real count, where sums overflowed a float or the search ran for hours
    (("memory", "--model", "175b", *F, "--seq-length", "1" + "0" * 30),
     "--seq-length: '1" + "0" * 30 + "' is invalid: expected an integer from 1 to 1,073,741,824"),
    (("search", "--model", "175b", *F, "--global-batch", str(10 ** 14)), "--global-batch"),
    (("search", "--model", "175b", *F, "--nodes", str(10 ** 7)), "from 1 to 131,072"),
    (("longest", "--model", "175b", *F, "--step", str(2 ** 31)), "--step"),
])
def test_counts_past_any_real_one_are_refused_by_argparse(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    out, err = capsys.readouterr()
    assert e.value.code == 2 and needle in err and not out, err


@pytest.mark.parametrize("argv,needle", [
    (("scaling", "--model", "175b", *F, "--nodes", f"16,{10 ** 8}"),
     "node counts from 1 to 131,072"),
    (("memory", "--config", "examples/local/tiny.yaml", "--set",
      f"model.num_layers={10 ** 12}", "--cluster", "a100"),
     "model.num_layers=1000000000000 is invalid: expected at most 100,000"),
])
def test_sizes_past_any_real_one_are_one_clear_line(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2 and needle in err and not out, err


def test_the_largest_counts_accepted_are_priced_in_seconds(capsys):
    """At the bounds the commands still answer (a million devices, a 2^30-token sequence)."""
    code, out, _ = run(capsys, "scaling", "--model", "gpt3-125m", "--cluster", "a100",
                       "--nodes", "1,131072", "--global-batch", "1048576", "--seq-length",
                       str(2 ** 30))
    assert code == 0 and "131072" in out


@pytest.mark.parametrize("argv,needle", [
    (("search", "--model", "gpt3-125m", "--cluster", "a100", "--out-config", "{tmp}/x.yaml",
      "--out-sbatch", "{tmp}/x.yaml"), "--out-sbatch: '{tmp}/x.yaml' is --out-config's "
                                       "file too: expected another file"),
    (("search", "--model", "gpt3-125m", "--cluster", "a100", "--out-config", "{tmp}"),
     "--out-config: '{tmp}' names a directory: expected a file to write"),
    (("search", "--model", "gpt3-125m", "--cluster", "a100", "--out-sbatch", "/dev/null/x.sh"),
     "--out-sbatch: '/dev/null/x.sh' lies inside the file '/dev/null'"),
    (("search", "--model", "gpt3-125m", "--cluster", "a100", "--out-sbatch", ""),
     "--out-sbatch: the path is empty"),
    (("scaling", "--model", "gpt3-125m", "--cluster", "a100", "--nodes", "1,2", "--plot",
      "{tmp}/p.txt"), "a file ending in .png, .pdf, .svg"),
    (("scaling", "--model", "gpt3-125m", "--cluster", "a100", "--nodes", "1,2", "--plot",
      "{tmp}/p"), "add the extension, e.g. {tmp}/p.png"),
    (("longest", "--model", "1t", "--cluster", "a100"), "no layout of 1 node(s) fits"),
    (("search", "--model", "gpt3-125m", "--cluster", "a100", "--out-config", "{tmp}/a\nb.yaml",
      "--out-sbatch", "{tmp}/b.sh"), "expected a path of printable characters"),
])
def test_outputs_and_empty_results_are_refused_before_anything_is_printed(capsys, tmp_path,
                                                                          argv, needle):
    """An output that cannot be written is found before the search, not after its table (and
    matplotlib's traceback for a .txt plot); nothing is printed before a refusal."""
    code, out, err = run(capsys, *(a.format(tmp=tmp_path) for a in argv))
    assert code == 2 and needle.format(tmp=tmp_path) in err and not out, (out, err)
    assert list(tmp_path.iterdir()) == []


def test_no_command_is_a_refusal_on_stderr(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and not out and "error: name a command: search, memory" in err
