"""The layout search and what it writes. Failures name the part: enumeration rules, the paper's
layout lessons, the emitted config (must load and validate as the trainer does) or sbatch."""
import dataclasses

import pytest
import yaml

from megatron.config import load_config, schedules, validate_for_world
from megatron.config.errors import ConfigError, InputError
from megatron.launch import frontier_env
from megatron.planner import emit
from megatron.planner.layout import Job, Layout, layout_problem, run_as
from megatron.planner.models import preset_model
from megatron.planner.profile import load_profile
from megatron.planner.search import SearchSpace, enumerate_layouts, search

FRONTIER = load_profile("frontier")


def test_enumerated_layouts_respect_the_trainer_rules():
    job = Job(preset_model("22b"), 512, "bf16")
    layouts = list(enumerate_layouts(job, 64, 8, SearchSpace()))
    assert layouts
    for lay in layouts:
        assert lay.world == 64 and lay.global_batch == 512 and lay.tp <= 8
        assert not (lay.pp > 1 and lay.zero > 1)
        assert layout_problem(job, lay) is None


@pytest.mark.parametrize("framework,zeros,pp_max", [("deepspeed", {0, 1, 2, 3}, 8),
                                                    ("megatron-lm", {0, 1}, 8),
                                                    ("megatron-core", {0, 1}, 8),
                                                    ("fsdp", {2, 3}, 8)])
def test_the_search_offers_only_what_the_engine_runs(framework, zeros, pp_max):
    """Megatron-LM's optimizer is ZeRO-0 or 1; FSDP shards at ZeRO-2 or 3, with a pipeline too
    (Llama 3's engine), where DeepSpeed's pipeline engine takes only ZeRO-0/1."""
    job = Job(preset_model("gpt3-1.3b"), 64, "bf16")
    layouts = list(enumerate_layouts(job, 8, 8, SearchSpace(), framework))
    assert {lay.zero for lay in layouts} == zeros
    assert max(lay.pp for lay in layouts) == pp_max
    piped = {lay.zero for lay in layouts if lay.pp > 1}
    assert piped == (zeros & {0, 1} if framework == "deepspeed" else zeros)


_EVERY_AXIS = SearchSpace(cp=(1, 2, 4), cp_algos=("ulysses", "ring", "allgather", "hybrid"),
                          interleave=(1, 2), sequence_parallel=(False,), flash=(True,),
                          recompute=("none",), zero=(0, 1, 2, 3))


def _pipeline_and_cp(framework):
    """(schedule run, CP algorithm) pairs the search offers a 13B model on 16 devices."""
    job = Job(preset_model("gpt3-13b"), 64, "bf16")
    return {(run_as(lay), lay.cp_algo if lay.cp > 1 else "-")
            for lay in enumerate_layouts(job, 16, 8, _EVERY_AXIS, framework) if lay.pp > 1}


@pytest.mark.parametrize("framework,schedules_run,cp_algos", [
    ("deepspeed", {"1f1b", "zbh1", "interleaved", "zbv"}, {"-", "ulysses", "ring", "allgather",
                                                           "hybrid"}),
    ("megatron-deepspeed", {"1f1b", "zbh1"}, {"-", "ulysses"}),
    ("megatron-lm-2021", {"1f1b", "interleaved"}, {"-"}),
    ("fsdp", {"1f1b", "interleaved", "zbv"}, {"-", "ring", "allgather"}),
    ("aa-scaling", {"1f1b"}, {"-"}),
])
def test_the_search_offers_only_the_schedules_and_cp_the_engine_runs(framework, schedules_run,
                                                                     cp_algos):
    """Each schedule's record names the engines that run it (config/schedules: DeepSpeed's
    pipeline engine has no model chunks, Megatron-DeepSpeed adds ZB-H1; torch's pipelining
    has no plain-stage ZB-H1; Megatron-LM of 2021 and Aleph Alpha's Scaling no zero-bubble
    schedule), and each engine its context parallelism (overlap.Overlap.cp_algos): the search
    offers nothing else, where this trainer's offers every one. Nor a recompute policy the
    engine lacks (Scaling and Megatron-LM of 2021: every layer or none)."""
    found = _pipeline_and_cp(framework)
    assert {name for name, _ in found} == schedules_run
    assert {algo for _, algo in found} == cp_algos
    job = Job(preset_model("gpt3-1.3b"), 64, "bf16")
    policies = {lay.recompute for lay in enumerate_layouts(job, 8, 8, SearchSpace(), framework)}
    assert policies == ({"none", "full"} if framework in ("aa-scaling", "megatron-lm-2021")
                        else {"none", "selective", "full"})


@pytest.mark.parametrize("framework,flags,needle", [
    ("megatron-deepspeed", ["--pp", "4", "--schedule", "zbv", "--interleave", "2"],
     "--schedule zbv under framework megatron-deepspeed (DeepSpeed's pipeline engine"),
    ("megatron-deepspeed", ["--pp", "4", "--interleave", "2"],
     "--schedule interleaved under framework megatron-deepspeed"),
    ("megatron-lm-2021", ["--pp", "4", "--schedule", "zbh1"],
     "the engines that run zbh1: deepspeed, megatron-deepspeed, megatron-lm, megatron-core"),
    ("aa-scaling", ["--cp", "2", "--cp-algo", "ring"],
     "its context parallelism: none"),
    ("fsdp", ["--cp", "2", "--cp-algo", "ulysses", "--zero", "3"],
     "its context parallelism: ring, allgather"),
    ("aa-scaling", ["--recompute", "selective"], "its recompute: none, full"),
    ("megatron-lm-2021", ["--recompute", "selective"], "its recompute: none, full"),
])
def test_memory_refuses_a_layout_its_engine_cannot_run_by_name(capsys, framework, flags,
                                                               needle):
    from megatron.cli.plan import main
    argv = ["memory", "--model", "gpt3-13b", "--cluster", "a100", "--nodes", "2",
            "--global-batch", "64", "--framework", framework, *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--framework='{framework}' is invalid: expected an engine that runs layout" in err
    assert needle in err and "or another --framework" in err


@pytest.mark.parametrize("framework,flags,names", [
    ("aa-scaling", ["--zero-stages", "2,3"], ["--zero 2 (", "--zero 3 ("]),
    ("aa-scaling", ["--recompute-values", "selective"], ["--recompute selective (",
                                                          "--cp > 1 ("]),
    ("megatron-lm-2021", ["--cp-values", "2", "--pp-values", "1"], ["--cp > 1 ("]),
    ("megatron-lm-2021", ["--pp-values", "2", "--schedules", "zbh1"], ["--schedule zbh1 ("]),
    ("megatron-deepspeed", ["--cp-values", "2", "--cp-algos", "ring", "--pp-values", "1"],
     ["--cp-algo ring ("]),
    ("fsdp", ["--zero-stages", "0,1"], ["--zero 0 (", "--zero 1 ("]),
    ("deepspeed", ["--zero-stages", "3", "--pp-values", "2"], ["--zero 3 with a pipeline ("]),
])
def test_a_search_space_its_engine_runs_none_of_is_refused_by_what_it_asks(
        capsys, framework, flags, names):
    """A search whose space holds nothing the engine runs says so, naming what it asked for
    that the engine does not run (with the layouts each left out) and the flags that widen
    it; it used to say that nothing fits and to add nodes. Nothing is printed before it."""
    from megatron.cli.plan import main
    argv = ["search", "--model", "gpt3-13b", "--cluster", "a100", "--nodes", "2",
            "--global-batch", "64", "--framework", framework, *flags]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert (f"no layout of 16 devices in the search space runs under framework {framework}: "
            in err), err
    assert all(n in err for n in names), err
    assert "widen the space" in err and "add nodes" not in err and "layouts)" in err
    assert out == ""


def test_a_search_names_what_it_left_out_where_the_command_line_asked_for_it(capsys):
    """--schedules zbh1,1f1b under aa-scaling (1F1B only): the pipelined ZB-H1 layouts are left
    out and the search says so in a line of its own, with the count; a search that asks for
    nothing of the kind prints no such line, though its engine's defaults leave some out."""
    from megatron.cli.plan import main
    base = ["search", "--model", "gpt3-13b", "--cluster", "a100", "--nodes", "2",
            "--global-batch", "64"]
    assert main([*base, "--framework", "aa-scaling", "--schedules", "zbh1,1f1b",
                 "--cp-values", "1"]) == 0
    out = capsys.readouterr().out
    line = [x for x in out.splitlines() if x.startswith("left out")]
    assert len(line) == 1 and line[0].startswith(
        "left out, as framework aa-scaling does not run them: ") and (
        "--schedule zbh1 (" in line[0] and "--zero 2 (" in line[0]), line
    job = Job(preset_model("gpt3-13b"), 64, "bf16")
    prof = load_profile("a100")
    import dataclasses
    aa = dataclasses.replace(prof, spec=dataclasses.replace(prof.spec, framework="aa-scaling"))
    space = SearchSpace(schedules=("zbh1", "1f1b"))
    result = search(job, 2, aa, space)
    zbh1 = sum(1 for lay in enumerate_layouts(job, 16, 8, space) if lay.schedule == "zbh1")
    assert result.unrunnable["--schedule zbh1"] == zbh1 > 0
    # a ZeRO stage the engine refuses drops every layout at it, counted so
    # (FSDP runs every layout of this space: ZeRO-2, 1F1B, no CP)
    space2 = SearchSpace(zero=(2,), tp=(1,), schedules=("1f1b",))
    at_zero2 = len(list(enumerate_layouts(job, 16, 8, space2, "fsdp")))
    assert search(job, 2, aa, space2).unrunnable == {"--zero 2": at_zero2} and at_zero2 > 1
    assert all(c.layout.schedule == "1f1b" for c in result.ranked)
    assert main([*base, "--framework", "aa-scaling"]) == 0
    assert "left out" not in capsys.readouterr().out
    assert main(base) == 0
    assert "left out" not in capsys.readouterr().out


def test_longest_refuses_a_space_its_engine_runs_none_of(capsys):
    """megatron-plan longest --cp-values 2 under an engine with no context parallelism: refused
    by what it asked for, not reported as fitting not even 1024 tokens."""
    from megatron.cli.plan import main
    assert main(["longest", "--model", "gpt3-13b", "--cluster", "a100", "--nodes", "2",
                 "--global-batch", "64", "--framework", "aa-scaling", "--cp-values", "2"]) == 2
    out, err = capsys.readouterr()
    assert "runs under framework aa-scaling: --cp > 1 (" in err and "add nodes" not in err
    assert out == ""


def test_an_engine_refusal_carries_what_it_refuses_beside_its_message():
    """engine_run_problem and engine_problem return the one-line message (a str, as printed)
    keyed by what it refuses, the key search counts by: no parsing of the wording."""
    from megatron.planner.layout import check_layout, engine_run_problem
    from megatron.planner.memory import engine_problem
    from megatron.planner.overlap import Refusal
    job = Job(preset_model("gpt3-13b"), 64, "bf16")
    lay = Layout(1, 2, 8, 1, 8, 1, "full", True, False, schedule="zbh1")
    plain = dataclasses.replace(lay, schedule="1f1b")
    cases = [(engine_run_problem("aa-scaling", lay, job.model), "--schedule zbh1"),
             (engine_run_problem("megatron-lm-2021", dataclasses.replace(plain, pp=1, cp=2)),
              "--cp > 1"),
             (engine_run_problem("megatron-deepspeed",
                                 dataclasses.replace(plain, pp=1, cp=2, cp_algo="ring")),
              "--cp-algo ring"),
             (engine_run_problem("megatron-lm-2021",
                                 dataclasses.replace(plain, recompute="selective")),
              "--recompute selective"),
             (engine_problem("fsdp", 1), "--zero 1"), (engine_problem("megatron-lm", 3), "--zero 3")]
    for refusal, key in cases:
        assert isinstance(refusal, Refusal) and refusal.key == key, (refusal, key)
        assert key.replace(" > 1", "") in refusal and " under framework " in refusal
    assert engine_problem("deepspeed", 3) is None and engine_run_problem("deepspeed", lay) is None
    # check_layout tells the engine's refusal (an --framework error) from the trainer's
    with pytest.raises(ConfigError, match="--framework=.aa-scaling"):
        check_layout(job, lay, "aa-scaling")


def test_a_search_counts_a_trainer_rule_by_its_field_and_rule_whole():
    """The summary of what a search refused counts a trainer rule under its field, value and
    whole rule, without the layout's figures in parentheses or the fix: the 1T model's 200
    heads under Ulysses CP read 'query heads per tensor-parallel rank to be a multiple of
    parallel.context_parallel_size=8' (it used to be cut at the first parenthesis, leaving
    'expected query heads per tensor-parallel rank'), one key for every TP it breaks at."""
    job = Job(preset_model("1t"), 1536, "bf16")
    result = search(job, 16, load_profile("frontier"),
                    SearchSpace(cp=(8,), cp_algos=("ulysses",), tp=(2, 4, 8), pp=(2,),
                                recompute=("full",), zero=(1,), sequence_parallel=(False,)))
    key = ("model.num_attention_heads=200 is invalid: expected query heads per tensor-parallel "
           "rank to be a multiple of parallel.context_parallel_size=8")
    assert set(result.rejected) == {key}, result.rejected
    assert result.rejected[key] == result.enumerated > 0  # 100, 50 and 25 heads a TP rank
    # memory beyond the share a search allows is named with the share
    tight = search(Job(preset_model("gpt3-6.7b"), 64, "bf16"), 1, load_profile("a100"),
                   SearchSpace(tp=(1,), pp=(1,), micro_batch=(4,), zero=(1,), recompute=("none",),
                               flash=(True,), sequence_parallel=(False,), cp=(1,), ep=(1,),
                               memory_fraction=0.8))
    assert tight.rejected == {"exceed 0.8 of device memory": 1}, tight.rejected
    assert tight.explain_empty().endswith("or raise --memory-fraction (now 0.8)")
    message = layout_problem(job, Layout(2, 2, 4, 1, 384, 1, "full", True, False, cp=8))
    assert message.key == key and "tensor_parallel_size = 100)" in message  # whole, as printed
    assert "; change the head count" in message


def test_every_published_layout_runs_on_its_engine():
    """The records' engine lists and the engines' CP agree with every published run and
    layout sweep row (Zero Bubble's ZB-H1 and ZB-V on Megatron-LM, Primus's ZB-V, NVIDIA's
    ring CP on Megatron Core, Llama 3's all-gather CP under FSDP)."""
    from megatron.planner import sweeps
    from megatron.planner import validation as v
    from megatron.planner.layout import engine_run_problem
    pub = v.load_published()
    cases = (pub.cases + pub.held_out + pub.layouts
             + [r.case for s in sweeps.load_sweeps() for r in s.rows])
    assert len(cases) > 500
    refused = [(c.id, engine_run_problem(c.profile.spec.framework, c.layout)) for c in cases
               if engine_run_problem(c.profile.spec.framework, c.layout)]
    assert not refused, refused


def test_best_175b_layouts_on_1024_gcds_keep_tp_inside_a_node():
    # The paper's lesson, checked with TP across nodes allowed: the fastest layouts that fit
    # still keep tensor parallelism within one node (<= 8 GCDs) and pipeline across nodes.
    job = Job(preset_model("175b"), 1280, "bf16")
    result = search(job, 128, FRONTIER, SearchSpace(max_tp=32, sequence_parallel=(False,),
                                                     recompute=("none", "full")))
    assert any(lay.tp > 8 for lay in (c.layout for c in result.ranked))  # they were candidates
    top = result.ranked[:20]
    assert all(c.layout.tp <= 8 for c in top)
    assert all(c.layout.pp > 1 for c in top)
    assert all(c.memory.reserved_gb <= 64 for c in result.ranked)


def test_ranking_is_fastest_first():
    job = Job(preset_model("gpt3-1.3b"), 256, "bf16")
    ranked = search(job, 2, load_profile("a100")).ranked
    # ties to 4 significant digits are broken by memory, so compare at that precision
    speeds = [float(f"{c.time.tokens_per_s:.4g}") for c in ranked]
    assert speeds == sorted(speeds, reverse=True)


def test_nothing_fits_explains_why():
    result = search(Job(preset_model("1t"), 64, "bf16"), 1, FRONTIER)
    assert not result.ranked
    with pytest.raises(InputError, match="no layout of 8 devices fits"):
        result.best


def test_best_config_loads_and_validates(tmp_path):
    job = Job(preset_model("gpt3-350m"), 64, "bf16")
    best = search(job, 1, load_profile("h100")).best
    cfg = emit.layout_config(load_config(), job, best.layout, run_dir=str(tmp_path / "run"),
                             paper_optimizer=True)
    path = tmp_path / "best.yaml"
    path.write_text(emit.config_yaml(cfg, best, "h100", 1))
    loaded = load_config(str(path))
    assert validate_for_world(loaded, best.layout.world) == best.layout.dp
    assert loaded.parallel.tensor_parallel_size == best.layout.tp
    assert loaded.training.micro_batch_size == best.layout.micro_batch
    assert loaded.training.activation_checkpointing == best.layout.recompute
    assert loaded.model.hidden_size == 1024 and loaded.optimizer.lr == 6e-5


def test_frontier_sbatch_script():
    text = emit.sbatch_script(FRONTIER.spec, 16, "best.yaml")
    assert "#SBATCH -N 16" in text and "#SBATCH --network=disable_rdzv_get" in text
    assert ("srun --ntasks-per-node=8 --gpus-per-node=8 --gpu-bind=closest -c 7 "
            "--kill-on-bad-exit=1 python -m megatron.cli.train --config best.yaml --set run.dir=\"$RUN_DIR\"") in text
    # One source with examples/frontier/env.sh: the same text, embedded whole.
    assert frontier_env.env_script().rstrip("\n") in text
    assert "AWS_OFI_RCCL_LIB" not in text
    assert "RUN_DIR=${RUN_DIR:-$(megatron_run_root)/best}" in text


def test_the_signal_margin_covers_two_predicted_steps_and_a_save():
    from megatron.planner.emit import signal_margin_s
    assert signal_margin_s(None) == 300
    assert signal_margin_s(10.0) == 360            # 300 + 20 s, whole minutes
    assert signal_margin_s(240.0) == 780           # a 175B-scale step: 300 + 480 s


def test_layout_rules_have_one_home():
    """The planner refuses a layout with the trainer's own message (config/validate.py)."""
    from megatron.config.validate import layout_error
    job = Job(preset_model("gpt3-1.3b"), 64)
    lay = Layout(tp=3, pp=1, dp=1, micro_batch=1, grad_accum=64)
    expected = layout_error(job.model, 3, 1, lay.zero, False)
    assert expected is not None and layout_problem(job, lay) == str(expected)


def test_search_proposes_the_interleaved_schedule_where_it_wins_within_memory(tmp_path,
                                                                             capsys):
    """175B on 128 GCDs at global batch 64: 16-32 micro-batches a replica on 8-16 stages leave
    1F1B a bubble of 18-32%; interleaving divides the fill and drain by its chunks per stage,
    and its extra in-flight activations (1 + (p - 1)/(p v) stages' worth) still fit under full
    recompute. Offered V, search ranks an interleaved layout first, faster than every plain
    one; not offered (the default), it proposes none; --out-config writes it as the trainer's
    interleaved (or ZB-V) schedule with its chunks per stage."""
    job = Job(preset_model("175b"), 64, "bf16")
    prof = load_profile("frontier")
    base = SearchSpace(tp=(4, 8), pp=(8, 16), micro_batch=(1,), zero=(1,), recompute=("full",),
                       flash=(True,))
    plain = search(job, 16, prof, base)
    mixed = search(job, 16, prof, dataclasses.replace(base, interleave=(1, 2, 3, 4, 6)))
    assert all(c.layout.interleave == 1 for c in plain.ranked)
    # a chunked layout is listed once, under the schedule the trainer runs it as (1f1b with
    # chunks is the interleaved schedule: layout.run_as), not twice with the same figures
    chunked = [c.layout for c in mixed.ranked if c.layout.interleave > 1]
    assert chunked and all(lay.schedule in ("interleaved", "zbv") for lay in chunked)
    assert len({dataclasses.replace(lay, schedule=run_as(lay)) for lay in chunked}) == \
        len(chunked)
    best = mixed.best
    assert best.layout.interleave > 1 and best.fits
    assert best.time.step_s < plain.best.time.step_s
    # its plain twin: the same layout on one chunk per stage, under the default schedule
    # (ZB-V, which the search may rank first, runs on two chunks only)
    twin = dataclasses.replace(best.layout, interleave=1, schedule=schedules.DEFAULT)
    assert best.memory.peak_bytes > next(c for c in plain.ranked
                                         if c.layout == twin).memory.peak_bytes
    from megatron.cli.plan import main
    out = tmp_path / "best.yaml"
    assert main(["search", "--model", "175b", "--cluster", "frontier", "--nodes", "16",
                 "--global-batch", "64", "--tp-values", "4,8", "--pp-values", "8,16",
                 "--micro-batches", "1", "--zero-stages", "1", "--recompute-values", "full",
                 "--flash", "on", "--cp-values", "1", "--interleave-values", "1,2,3,4,6",
                 "--out-config", str(out)]) == 0
    assert "the trainer refuses it" not in capsys.readouterr().out
    written = yaml.safe_load(out.read_text())["parallel"]
    assert written["virtual_pipeline_size"] == best.layout.interleave
    assert written["pipeline_schedule"] in ("interleaved", "zbv")


def test_end_splits_cut_alike_by_hand():
    """Both ends d lighter: f + f + (chunks - 2)(f + d) = layers. Llama 3 405B's 126 layers on
    16 stages are 7, 8 x 14, 7 (d = 1), and on 16 x 2 chunks 3, 4 x 30, 3; no split where f is
    not whole, none at d = 0 (the even split), none alike on two chunks."""
    from megatron.planner.search import end_splits
    assert end_splits(126, 16, (1,)) == [(7, 7)] and 7 + 14 * 8 + 7 == 126
    assert end_splits(126, 32, (1,)) == [(3, 3)] and 3 + 30 * 4 + 3 == 126
    assert end_splits(46, 4, (1,)) == [(11, 11)]
    assert end_splits(48, 4, (3,)) == []  # 10.5
    assert end_splits(48, 2, (1,)) == [] and end_splits(48, 4, (0,)) == []


def test_search_proposes_lighter_end_stages_where_they_win_within_memory(tmp_path):
    """A 2048-wide model with a 256k vocabulary on 4 stages: the logits on the last stage cost
    several layers (2 h V against about 24 h^2 multiply-adds per token), so the even split (12
    a stage) waits on its last stage. Lighter ends are predicted faster, and the ends are
    chosen apart: the embedding costs the first stage little, so the planner puts 13, 13, 13, 9
    first (66.8 s a step against 80.9 s even), ahead of the best split with both ends alike
    (10, 14, 14, 10: 71.5 s). Without lighter_ends no split is offered; for the 22B model
    (51200 vocabulary, 6144 wide) the even split stays first."""
    model = dataclasses.replace(preset_model("22b"), hidden_size=2048, num_attention_heads=16,
                                vocab_size=256000)
    job = Job(model, 512, "bf16")
    base = SearchSpace(tp=(1,), pp=(4,), micro_batch=(2,), zero=(1,), recompute=("none",),
                       flash=(True,), sequence_parallel=(False,), schedules=("1f1b",))
    even = search(job, 1, FRONTIER, base)
    assert all(not c.layout.uneven for c in even.ranked)
    split = search(job, 1, FRONTIER, dataclasses.replace(base, lighter_ends=tuple(range(11))))
    best = split.best.layout
    from megatron.config.stages import stage_layers
    counts = stage_layers(48, 4, best.first_stage_layers, best.last_stage_layers)
    assert counts[-1] == min(counts) < 12 < counts[0]  # the last stage alone lighter
    assert split.best.time.step_s < 0.9 * even.best.time.step_s
    alike = [c for c in split.ranked if c.layout.uneven and
             c.layout.first_stage_layers == c.layout.last_stage_layers]
    assert alike and split.best.time.step_s < 0.95 * alike[0].time.step_s
    for c in split.ranked:
        assert layout_problem(job, c.layout) is None
    cfg = emit.layout_config(load_config(None), job, best)  # validated as the trainer does
    assert (cfg.parallel.pipeline_first_stage_layers or None) == best.first_stage_layers
    assert cfg.parallel.pipeline_last_stage_layers == best.last_stage_layers
    plain = Job(preset_model("22b"), 512, "bf16")
    assert not search(plain, 1, FRONTIER, dataclasses.replace(
        base, tp=(2,), recompute=("full",), lighter_ends=(0, 1, 2))).best.layout.uneven


def test_end_splits_choose_each_end_apart():
    """By hand: 48 layers on 4 chunks, one end lighter by d: middle (48 + d) / 4, so d = 4
    gives 13, 13, 13, 9 (last lighter) or 9, 13, 13, 13; both by 2: 11, 13, 13, 11; two chunks
    take only unequal pairs (24/24 is the even split); the trainer's rule accepts each."""
    from megatron.config.stages import stage_layers, uneven_problem
    from megatron.planner.search import end_splits
    splits = end_splits(48, 4, (0, 2, 4))
    assert (None, 9) in splits and (9, None) in splits and (11, 11) in splits
    assert (None, None) not in splits
    assert stage_layers(48, 4, None, 9) == [13, 13, 13, 9]
    assert end_splits(48, 4, (0,)) == [] and end_splits(48, 1, (0, 1)) == []
    assert end_splits(48, 4, (0, 1)) == []  # 49 / 4 and 50 / 4 do not split
    assert end_splits(48, 2, (0, 2)) == [(None, 23), (23, None)]
    for chunks, lighter in ((4, (0, 2, 4)), (2, (0, 2)), (16, (0, 1, 2, 3))):
        for first, last in end_splits(48, chunks, lighter):
            assert uneven_problem(48, chunks, first, last) is None
            assert sum(stage_layers(48, chunks, first, last)) == 48


def test_lighter_ends_open_stage_counts_that_do_not_divide_the_layers():
    """46 layers: 4 stages only as 11, 12, 12, 11, 8 as 5, 6 x 6, 5 and 16 as 2, 3 x 14, 2, each a split the
    trainer's rule accepts; the default space offers neither stage count."""
    job = Job(dataclasses.replace(preset_model("22b"), num_layers=46), 512, "bf16")
    space = SearchSpace(tp=(2,), micro_batch=(1,), zero=(1,), recompute=("full",),
                        flash=(True,), sequence_parallel=(False,))
    assert {lay.pp for lay in enumerate_layouts(job, 64, 8, space)} == {1, 2}
    wide = dataclasses.replace(space, lighter_ends=(0, 1))
    ends = {(lay.pp, lay.first_stage_layers, lay.last_stage_layers)
            for lay in enumerate_layouts(job, 64, 8, wide)}
    # two stages: 23/23 is the even split; 24/22 and 22/24 take one end lighter by 2, not 1
    assert ends == {(1, None, None), (2, None, None), (4, 11, 11), (8, 5, 5),
                    (16, 2, 2)}  # 2, 3 x 14, 2
    for lay in enumerate_layouts(job, 64, 8, wide):
        assert layout_problem(job, lay) is None



def test_the_table_shows_zero_twins_once():
    """Neighbours that differ in the ZeRO stage alone, every figure equal (ZeRO-0 and 1 under
    DeepSpeed's bf16 pipeline engine keep the same sharded optimizer), share one row: rank
    "a-b", ZeRO "x/y"; a neighbour whose figures differ keeps its own row."""
    job = Job(preset_model("22b"), 1280, "bf16")
    ranked = search(job, 16, FRONTIER, SearchSpace(tp=(2,), pp=(2,), micro_batch=(2,),
                                                  recompute=("none",), flash=(True,),
                                                  sequence_parallel=(True,),
                                                  schedules=("zbh1",))).ranked
    zeros = [c.layout.zero for c in ranked]
    assert {0, 1} <= set(zeros)
    rows = emit.table_rows(ranked)
    twins = [r for r in rows if "/" in r[emit.ZERO_COLUMN]]
    assert twins and all("-" in r[0] for r in twins)
    assert sum(len(r[emit.ZERO_COLUMN].split("/")) for r in rows) == len(ranked)
    first, second = (int(x) for x in twins[0][0].split("-"))
    a, b = ranked[first - 1], ranked[second - 1]
    assert a.layout.zero != b.layout.zero
    assert dataclasses.replace(a.layout, zero=b.layout.zero) == b.layout
    assert f"{a.time.step_s:.3g}" == f"{b.time.step_s:.3g}"


def test_search_groups_micro_batches_the_stages_do_not_divide(tmp_path):
    """175B on 64 H100s at TP 8 x PP 8 and global batch 12: 12 micro-batches on 8 stages, which
    Megatron's default grouping (by the stages) cannot run interleaved. The search offers the
    interleaved layouts with the one group that takes them (12: a group of 8 would leave a last
    group of 4, under the stages), the memory priced with (v - 1) x 12 chunks in the warm-up,
    and the config it writes validates as the trainer's."""
    job = Job(preset_model("175b"), 12, "bf16")
    space = SearchSpace(tp=(8,), pp=(8,), micro_batch=(1,), zero=(1,), recompute=("full",),
                        flash=(True,), sequence_parallel=(True,), interleave=(1, 2),
                        schedules=("1f1b", "interleaved"))
    ranked = search(job, 8, load_profile("h100"), space).ranked
    grouped = [c for c in ranked if c.layout.interleave == 2]
    assert grouped and all(c.layout.microbatch_group == 12 for c in grouped)
    lay = grouped[0].layout
    assert lay.key().endswith("-g12") and lay.pipe.group == 12
    assert layout_problem(job, dataclasses.replace(lay, microbatch_group=0)) is not None
    # the warm-up: stage 0 holds 2 (8 - 1) + (2 - 1) 12 + 1 = 27 chunks, capped at the 12
    # micro-batches a stage (13.5 > 12); with a group of 8 it would be 23 chunks, 11.5
    assert schedules.get("interleaved").stored(lay.pipe, 0, 1.0, 0.0) == 12
    assert schedules.get("interleaved").stored(
        dataclasses.replace(lay.pipe, micro_batches=16, group=0), 0, 1.0, 0.0) == 11.5
    # uncapped, 10 micro-batches on 4 stages: groups of 5 hold 2 x 3 + 5 + 1 = 12 chunks (6
    # stage-equivalents), one group of 10 holds 17 (8.5)
    from megatron.config.schedules.registry import Pipe
    inter = schedules.get("interleaved")
    assert [inter.stored(Pipe(4, 10, 2, g), 0, 1.0, 0.0) for g in (5, 10)] == [6.0, 8.5]
    cfg = emit.layout_config(load_config(None), job, lay)
    assert cfg.parallel.pipeline_microbatch_group == 12
    assert validate_for_world(cfg, 64) == 1


@pytest.mark.parametrize("space, needle", [
    (dict(tp=(3,)), "TP 3 does not divide the 8 devices"),
    (dict(pp=(5,)), "PP 5 does not divide the 8 devices TP 1 leaves"),
    (dict(micro_batch=(999,)), "the global batch 64 is not a multiple of micro-batch 999 x DP 1"),
    (dict(cp=(3,)), "no context-parallel degree of 3 divides the 8 devices TP 1 x PP 1 leave"),
])
def test_a_space_that_makes_no_layout_says_why_and_which_flags(space, needle):
    """A search whose every combination is no layout of the devices names the sizes that do
    not divide, instead of "0 enumerated: none valid; add nodes"."""
    job = Job(preset_model("gpt3-350m"), 64, "bf16")
    result = search(job, 1, load_profile("a100"), SearchSpace(**space))
    assert result.enumerated == 0 and not result.ranked
    message = result.explain_empty()
    assert needle in message and "widen --tp-values, --pp-values, --micro-batches" in message


def test_a_base_configs_batch_ramp_leaves_only_the_layouts_that_split_it(tmp_path):
    """A config with training.rampup_batch_size [8, 8, ...] to 64 on 8 H100s: without the ramp
    the best layout is 8 micro-batches of 8 samples (mb x dp = 64); the ramp's first step of 8
    samples splits only where mb x dp divides 8, so the search offers those alone, counts the
    others under the ramp's rule, and the config it writes validates as the trainer's."""
    from megatron.planner.jobs import load_job
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"model": {"num_layers": 24, "hidden_size": 1024,
                                              "num_attention_heads": 16, "seq_length": 2048,
                                              "max_position_embeddings": 2048},
                                    "training": {"global_batch_size": 64,
                                                 "rampup_batch_size": [8, 8, 100000]}}))
    job, cfg, _ = load_job(config=str(base))
    assert job.ramp == (8, 8, 100000)
    free = search(dataclasses.replace(job, ramp=None), 1, load_profile("h100")).best.layout
    assert free.micro_batch * free.dp > 8
    result = search(job, 1, load_profile("h100"))
    assert result.ranked and all(8 % (c.layout.micro_batch * c.layout.dp) == 0
                                 for c in result.ranked)
    (key,) = [k for k in result.rejected if "rampup_batch_size" in k]
    assert "multiples of micro_batch_size x data-parallel size" in key
    best = result.best
    out = emit.layout_config(cfg, job, best.layout, run_dir=str(tmp_path / "run"))
    assert out.training.rampup_batch_size == [8, 8, 100000]
    assert validate_for_world(out, best.layout.world) == best.layout.dp
    # a --global-batch the ramp cannot reach is refused, naming the ramp
    with pytest.raises(ConfigError, match=r"training.rampup_batch_size=\[8, 8, 100000\] is "
                                          r"invalid: expected a start below training."
                                          r"global_batch_size=4"):
        load_job(config=str(base), global_batch=4)
