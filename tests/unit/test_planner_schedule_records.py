"""Pipeline schedules are records (megatron/config/schedules): a toy GPipe, defined and registered
here only, is accepted by the config, priced by the planner through its own closed forms, listed
by megatron-plan, and refused by the trainer at start-up because no engine runner runs it. A
failure in the pricing tests points at the record's hook the planner no longer calls
(Schedule.stored, bubble, pipeline_time); in the last test at a file of megatron/ that branches
on a schedule's name outside that schedule's record."""
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from megatron.config import ConfigError, load_config, schedules, validate_for_world
from megatron.config.schedules import Pipe, Schedule
from megatron.config.schedules.one_f_one_b import in_flight
from megatron.engine import pipe_order, runners
from megatron.launch.startup import StartupTimer
from megatron.planner import activations as act
from megatron.planner import emit
from megatron.planner.layout import Job, Layout, layout_problem
from megatron.planner.memory import memory_per_stage, peak_memory
from megatron.planner.models import preset_model
from megatron.planner.params import all_stage_params
from megatron.planner.profile import load_profile
from megatron.planner.search import SearchSpace, enumerate_layouts
from megatron.planner.timing import pipeline_features, step_time
from megatron.training import startup
from tests.support.paths import ROOT, TINY


def _gpipe_stored(pipe: Pipe, stage: int, per_mb: float, per_w: float) -> float:
    """All forwards, then all backwards: every stage holds all m micro-batches at its peak."""
    return pipe.micro_batches * per_mb


def _gpipe_bubble(pipe: Pipe, w_share: float) -> float:
    p, m = pipe.stages, pipe.micro_batches
    return (p - 1) / (m + p - 1)


def _gpipe_time(pipe: Pipe, stages, weights, slowest: int):
    return pipe.micro_batches * stages[slowest][0] + schedules.fill(stages, slowest)


def _gpipe_rule(pp: int, cp: int, chunks: int):
    if chunks > 1:
        return ConfigError("parallel.pipeline_schedule", "gpipe", "plain stages")
    return None


GPIPE = Schedule(name="gpipe", title="GPipe", priced="all forwards, then all backwards",
                 bubble=_gpipe_bubble, stored=_gpipe_stored, pipeline_time=_gpipe_time,
                 rule=_gpipe_rule)


@pytest.fixture
def gpipe():
    schedules.register(GPIPE)
    yield GPIPE
    schedules.unregister(GPIPE.name)


def _job():
    return Job(preset_model("22b", 2048), 1024, "bf16")


def _lay(schedule, pp=4, m=8):
    return Layout(2, pp, 1024 // m, 1, m, 1, "none", True, False, schedule=schedule)


def test_the_config_accepts_a_registered_schedule_and_only_then(gpipe):
    overrides = ["parallel.pipeline_schedule=gpipe", "parallel.pipeline_parallel_size=2"]
    cfg = load_config(TINY, overrides)
    assert cfg.parallel.pipeline_schedule == "gpipe"
    assert validate_for_world(cfg, 2) == 1
    schedules.unregister("gpipe")
    with pytest.raises(ConfigError, match=r"pipeline_schedule='gpipe' is invalid: expected one "
                                          r"of 1f1b, zbh1"):
        load_config(TINY, overrides)
    schedules.register(GPIPE)


def test_the_planner_prices_its_memory_by_its_own_closed_form(gpipe):
    """Hand calculation: a stage keeps per micro-batch its layers' stored activations and,
    but the last, its output; GPipe holds m = 8 of them on every stage, 1F1B min(p - s, m)."""
    job, prof = _job(), load_profile("frontier")
    c = prof.constants
    mine, ones = (memory_per_stage(job, _lay(s), c) for s in ("gpipe", "1f1b"))
    lay = _lay("gpipe")
    for s, (sp, g, o) in enumerate(zip(all_stage_params(job.model, 2, 4), mine, ones)):
        per_mb = sp.layers * act.layer_stored_bytes(job.model, lay, "bf16")
        if s < 3:
            per_mb += act.boundary_bytes(job.model, lay, "bf16")
        assert g.activations == pytest.approx(8 * per_mb * c.act_scale, rel=1e-12), s
        assert g.activations == pytest.approx(o.activations * 8 / min(4 - s, 8), rel=1e-12), s
        assert in_flight(lay.pipe, s) == min(4 - s, 8)
    assert peak_memory(job, lay, c).peak_bytes > peak_memory(job, _lay("1f1b"), c).peak_bytes


def test_the_planner_prices_its_time_by_its_own_closed_form(gpipe):
    """GPipe's bubble is 1F1B's, (p - 1)/(m + p - 1) = 3/11 at p = 4, m = 8, and its step the
    same m slots of the slowest stage plus the others' fill and drain."""
    job, prof = _job(), load_profile("frontier")
    mine, one = (step_time(job, _lay(s), prof) for s in ("gpipe", "1f1b"))
    assert mine.bubble == pytest.approx(3 / 11) and one.bubble == pytest.approx(3 / 11)
    assert mine.step_s == one.step_s
    # one-feature stages: first 1.1, two middle 1.0, last 1.4 -> 8 * 1.4 + (1.1 + 2 + 1.4 - 1.4)
    stages = [(np.array([1.1]), 1), (np.array([1.0]), 2), (np.array([1.4]), 1)]
    weights = [np.zeros(1)] * 3
    priced = pipeline_features(_lay("gpipe"), stages, weights, np.ones(1))
    assert float(priced[0]) == pytest.approx(8 * 1.4 + 3.1)


def test_the_search_tries_it_only_when_asked_and_writes_no_config_for_it(gpipe):
    """No runner: the default space leaves it out (as the interleaved comparison is opt-in);
    named, it is enumerated and priced, but megatron-plan will not write its config."""
    job = _job()
    assert "gpipe" not in SearchSpace().schedules
    space = SearchSpace(tp=(2,), pp=(4,), micro_batch=(1,), zero=(1,), recompute=("none",),
                        flash=(True,), sequence_parallel=(False,), schedules=("1f1b", "gpipe"))
    found = {lay.schedule for lay in enumerate_layouts(job, 128, 8, space)}
    assert found == {"1f1b", "gpipe"}
    assert layout_problem(job, dataclasses.replace(_lay("gpipe"), interleave=2)) is not None
    with pytest.raises(ConfigError, match="priced for comparison only"):
        emit.layout_config(load_config(TINY), job, _lay("gpipe"))


def test_megatron_plan_lists_and_prices_it(gpipe, capsys):
    from megatron.cli.plan import main
    assert main(["memory", "--model", "22b", "--cluster", "frontier", "--nodes", "16",
                 "--global-batch", "1024", "--tp", "2", "--pp", "4", "--schedule", "gpipe"]) == 0
    assert "schedule priced: gpipe (all forwards, then all backwards)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["search", "--help"])
    assert "gpipe (GPipe)" in capsys.readouterr().out


def test_the_trainer_refuses_it_at_start_up_naming_those_it_runs(gpipe, monkeypatch):
    """Before any rendezvous: the message names the field, the value and the runnable ones."""
    for var in ("SLURM_PROCID", "SLURM_NTASKS", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = load_config(TINY, ["parallel.pipeline_schedule=gpipe",
                             "parallel.pipeline_parallel_size=2", "training.check_node=false"])
    with pytest.raises(ConfigError) as e:
        startup.start(cfg, StartupTimer())
    assert str(e.value).startswith("parallel.pipeline_schedule='gpipe' is invalid: expected a "
                                   "schedule this trainer runs: one of 1f1b, zbh1, interleaved, zbv (gpipe, GPipe,")
    with pytest.raises(ValueError, match="lock steps"):
        pipe_order.stage_steps("gpipe", 2, 0, 4)
    monkeypatch.setitem(runners.RUNNERS, "gpipe-runner", lambda engine, module, name: "")
    monkeypatch.setattr(schedules.registry, "_RECORDS",
                        {**schedules.registry._RECORDS,
                         "gpipe": dataclasses.replace(GPIPE, runner="gpipe-runner")})
    assert runners.runner_error("gpipe") is None and "gpipe" in runners.runnable()


def test_registration_refuses_a_second_record_under_a_name():
    one = schedules.get("1f1b")
    assert schedules.register(one) is one  # the same record again: nothing changes
    with pytest.raises(ValueError, match="already registered"):
        schedules.register(dataclasses.replace(one, title="another"))
    with pytest.raises(ValueError, match="already registered"):
        runners.register_runner("deepspeed", lambda engine, module, name: "")
    with pytest.raises(ValueError, match="lower-case"):
        dataclasses.replace(GPIPE, name="G,Pipe")
    with pytest.raises(ValueError, match="cannot be unregistered"):
        schedules.unregister(schedules.DEFAULT)
    assert schedules.names()[0] == schedules.DEFAULT


RECORD_FILES = {"megatron/config/schedules/one_f_one_b.py", "megatron/config/schedules/zbh1.py",
                "megatron/config/schedules/interleaved.py", "megatron/config/schedules/zbv.py"}


def _branch_on_a_name() -> "re.Pattern":
    """`x == "zbh1"`, `"1f1b" != x`, `x in ("1f1b", ...)`, a list of names of its own
    (`("1f1b", "zbh1")`, or a call that hard-codes one: `f("zbh1", ...)`) and a table keyed by
    them (`{"1f1b": ...}`), for every registered name."""
    names = "|".join(re.escape(n) for n in schedules.names())
    name = rf"""["']({names})["']"""
    return re.compile(rf"""[=!]=\s*{name}|{name}\s*[=!]=|\bin\s*[(\[{{]\s*{name}"""
                      rf"""|[(\[{{]\s*{name}\s*,|{name}\s*:\s""")


def test_the_rule_catches_the_branches_it_replaced():
    branch = _branch_on_a_name()
    for line in ('if lay.schedule == "zbh1":', "if self.schedule != '1f1b' else ''",
                 'choices=("1f1b", "zbh1")', 'if "zbh1" == schedule:', 'schedules=("1f1b",)',
                 'pipe_order.stage_steps("zbh1", self.stages', 'NOTE = {"1f1b": "bubble"'):
        assert branch.search(line), line
    assert not branch.search('pipeline_schedule: str = "1f1b"')


def test_only_a_schedules_record_compares_against_its_name():
    """Every branch on a schedule's name, and every list of names, belongs in that schedule's own
    record file (its rule, closed forms or facts) or the registry, nowhere else in megatron/."""
    branch, root = _branch_on_a_name(), Path(ROOT)
    found = [f"{path.relative_to(root)}:{i}: {line.strip()}"
             for path in sorted((root / "megatron").rglob("*.py"))
             if path.relative_to(root).as_posix() not in RECORD_FILES
             for i, line in enumerate(path.read_text().splitlines(), 1)
             if branch.search(line.split("#", 1)[0])]  # comments may name them
    assert not found, "branches on a schedule's name outside its record:\n" + "\n".join(found)
