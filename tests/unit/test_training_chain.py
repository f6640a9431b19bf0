"""Chained Slurm jobs (megatron/training/chain.py, examples/frontier/chain.sh) without Slurm: the
progress read from the run directory, the begin/end decisions (finished, no progress, bound on
jobs, chaining off), the next job's sbatch line and environment. chain.sh driving the module
against stand-in squeue/sbatch: tests/integration/test_training_chain_sh.py; the chain under a
real Slurm: tests/e2e/test_training_slurm_chain.py. The nodes of tasks that died first, read from
srun's stderr as Debian's Slurm writes it under --kill-on-bad-exit=1 (recorded from the e2e
cluster), and the exclusions a partition can hold."""
import pytest

from megatron.config.errors import InputError
from megatron.training import chain, chain_nodes
from tests.support.chain import SEP, commit


def test_progress_is_the_newest_complete_checkpoint(tmp_path):
    assert chain.progress(str(tmp_path), 6) == chain.Progress(str(tmp_path), 0, 6)
    commit(tmp_path, 2)
    commit(tmp_path, 4)
    commit(tmp_path, 6, complete=False)  # what the next job would skip, so no progress
    p = chain.progress(str(tmp_path), 6)
    assert (p.step, p.finished) == (4, False)
    assert len(p.skipped) == 1 and "step_0000006" in p.skipped[0]
    commit(tmp_path, 7)
    assert chain.progress(str(tmp_path), 6).finished


ON = chain.Settings(True, 1, 20)


def test_a_job_that_rolls_back_starts_from_its_checkpoint_not_the_runs_newest(tmp_path):
    """checkpoint.roll_back: begin judges a rollback of a finished run as not finished, and
    end's progress from the step it rolls back to (not the newest it moves aside)."""
    for step in (2, 4, 6):
        commit(tmp_path, step)
    p = chain.progress(str(tmp_path), 6)
    assert not chain.begin(p, ON).go  # finished: nothing to train
    step_2 = str(tmp_path / "checkpoints" / "step_0000002")
    back = chain.rollback_start(p, step_2, True)
    assert back.step == 2 and not back.finished
    d = chain.begin(back, ON)
    assert d.go and "continuing from step 2" in d.message, d.message
    assert chain.end(chain.Progress(str(tmp_path), 3, 6), back.step, 0, ON).go  # 3 > 2
    assert chain.rollback_start(p, None, True).step == 0  # a fresh start that moves all aside
    for load, roll_back in ((step_2, False), ("auto", True)):  # no rollback: the newest
        assert chain.rollback_start(p, load, roll_back) == p
    assert chain.rollback_start(p, str(tmp_path / "nothing"), True) == p  # the trainer says why
    assert chain.rollback_start(p, str(tmp_path / "checkpoints"), True) == p  # its newest


def test_settings_from_the_environment():
    job = {"SLURM_JOB_ID": "7"}
    assert chain.settings(job) == chain.Settings(True, 1, 20, job=chain.JobFacts("7"))
    facts = chain.settings({**job, "SLURM_JOB_PARTITION": "batch", "SLURM_JOB_NUM_NODES": "16",
                            "MEGATRON_CHAIN_SRUN_LOG": "/tmp/e", "MEGATRON_CHAIN_MAX_EXCLUDED":
                            "3"}).job
    assert facts == chain.JobFacts("7", "/tmp/e", "batch", 16, 3)
    s = chain.settings({**job, "MEGATRON_CHAIN_ATTEMPT": "3",
                        "MEGATRON_CHAIN_MAX_ATTEMPTS": "5"})
    assert (s.enabled, s.attempt, s.max_attempts) == (True, 3, 5)
    s = chain.settings({**job, "MEGATRON_CHAIN_FAILURES": "0", "MEGATRON_CHAIN_MAX_FAILURES": "5"})
    assert (s.failures, s.max_failures) == (0, 5)
    off = chain.settings({**job, "MEGATRON_CHAIN": "0"})
    assert not off.enabled and "MEGATRON_CHAIN=0" in off.off_reason
    assert "checkpoint.save=false" in chain.settings(job, final_save=False).off_reason
    assert "not inside a Slurm job" in chain.settings({}).off_reason


@pytest.mark.parametrize("env, name", [
    ({"MEGATRON_CHAIN_ATTEMPT": "two"}, "MEGATRON_CHAIN_ATTEMPT='two'"),
    ({"MEGATRON_CHAIN_MAX_ATTEMPTS": "0"}, "MEGATRON_CHAIN_MAX_ATTEMPTS='0'"),
    ({"MEGATRON_CHAIN": "maybe"}, "MEGATRON_CHAIN='maybe'"),
    # str.isdigit() takes a superscript two, which int() then refused with a traceback
    ({"MEGATRON_CHAIN_MAX_ATTEMPTS": "\u00b2"}, "MEGATRON_CHAIN_MAX_ATTEMPTS='\u00b2'"),
    ({"MEGATRON_CHAIN_MAX_FAILURES": "\u0663"}, "MEGATRON_CHAIN_MAX_FAILURES='\u0663'"),
])
def test_bad_settings_name_the_variable(env, name):
    with pytest.raises(InputError, match=name):
        chain.settings(env)


def at(step, iters=6):
    return chain.Progress("runs/r", step, iters)


def test_begin_trains_unless_the_run_is_finished():
    assert chain.begin(at(0), ON).go and "starting" in chain.begin(at(0), ON).message
    d = chain.begin(at(4), chain.Settings(True, 3, 20))
    assert d.go and "job 3 of at most 20" in d.message and "from step 4" in d.message
    d = chain.begin(at(6), ON)
    assert not d.go and "finished" in d.message
    # Chaining off: the job does what it did before chains existed.
    assert chain.begin(at(6), chain.Settings(False, 1, 20, "chaining is off")).go


def test_end_submits_only_after_progress():
    d = chain.end(at(4), 2, 0, ON)
    assert d.go and "submitting job 2" in d.message
    assert chain.end(at(4), 2, 1, ON).go  # a job that failed after committing steps
    d = chain.end(at(6), 4, 0, ON)
    assert not d.go and "finished after 1 job(s) of this chain" in d.message
    d = chain.end(at(0), 0, 0, ON)  # ended cleanly before its first save
    assert not d.go and "no progress" in d.message and "too short for one save" in d.message


def test_a_job_that_failed_before_its_first_checkpoint_is_tried_again_within_a_bound():
    """Issue 20 item 6: a node lost at start-up, a hang before the first save or a rank killed
    (exit 1, 137, ...) no longer ends the chain; the failures in a row stay under a bound."""
    d = chain.end(at(2), 2, 1, ON)
    assert d.go and d.failures == 1 and "failure 1 of at most 3 in a row" in d.message
    d = chain.end(at(2), 2, 137, chain.Settings(True, 2, 20, "", failures=1))
    assert d.go and d.failures == 2
    d = chain.end(at(2), 2, 1, chain.Settings(True, 3, 20, "", failures=2))
    assert not d.go and "3 jobs in a row failed without progress" in d.message
    assert chain.end(at(4), 2, 1, chain.Settings(True, 3, 20, "", failures=2)).failures == 0


@pytest.mark.parametrize("status, words", [(2, "a configuration or input error"),
                                           (3, "the run diverged")])
def test_a_failure_the_next_job_would_repeat_stops_at_once(status, words):
    d = chain.end(at(2), 2, status, ON)
    assert not d.go and f"exit status {status}" in d.message and words in d.message


def test_end_stops_at_the_bound_on_jobs():
    assert chain.end(at(4), 2, 0, chain.Settings(True, 19, 20)).go
    d = chain.end(at(4), 2, 0, chain.Settings(True, 20, 20))
    assert not d.go and "job 20 of at most 20" in d.message and "Submit again" in d.message


def test_end_with_chaining_off_never_submits():
    d = chain.end(at(4), 2, 0, chain.Settings(False, 1, 20, "chaining is off (MEGATRON_CHAIN=0)"))
    assert not d.go and "MEGATRON_CHAIN=0" in d.message


def squeue_line(**over):
    fields = dict(name="megatron", account="abc123", qos="(null)", partition="batch",
                  limit="02:00:00", nodes="16", features="nvme", reservation="(null)",
                  workdir="/home/me/megatron", command="/home/me/megatron/train.sbatch "
                  "examples/frontier/175b.yaml --set a.b=c d")
    fields.update(over)
    return SEP.join(fields.values()) + "\n"


ARGS = ["examples/frontier/175b.yaml", "--set", "a.b=c d"]


def test_sbatch_command_repeats_the_job():
    cmd = chain.sbatch_command("1234", squeue_line(), ARGS)
    assert cmd == ["sbatch", "--parsable", "--dependency=afterany:1234", "--nodes=16",
                   "--time=02:00:00", "--account=abc123", "--partition=batch",
                   "--constraint=nvme", "--job-name=megatron", "--chdir=/home/me/megatron",
                   "--", "/home/me/megatron/train.sbatch", *ARGS]


def test_sbatch_command_leaves_out_what_was_not_asked_for():
    cmd = chain.sbatch_command("9", squeue_line(account="(null)", features="", limit="UNLIMITED",
                                                command="/s.sbatch"), [])
    assert not any(c.startswith(("--account", "--constraint", "--time", "--qos")) for c in cmd)
    assert cmd[-2:] == ["--", "/s.sbatch"]


def test_script_path_needs_the_known_arguments():
    assert chain.script_path("/a b/job.sbatch x y", ["x", "y"]) == "/a b/job.sbatch"
    with pytest.raises(InputError, match="MEGATRON_CHAIN_SCRIPT"):
        chain.script_path("/a/job.sbatch x y", ["x", "z"])
    with pytest.raises(InputError, match="MEGATRON_CHAIN_SCRIPT"):
        chain.script_path("(null)", [])
    cmd = chain.sbatch_command("9", squeue_line(command="(null)"), ["x"], script="/mine.sbatch")
    assert cmd[-3:] == ["--", "/mine.sbatch", "x"]


def test_next_env_is_the_submission_environment():
    env = chain.next_env({"PATH": "/venv/bin", "SLURM_JOB_ID": "5", "SLURM_NNODES": "2",
                          "SLURM_CONF": "/etc/slurm.conf", "SBATCH_ACCOUNT": "abc",
                          "MEGATRON_CHAIN_ATTEMPT": "2"}, attempt=2, failures=1)
    assert env == {"PATH": "/venv/bin", "SLURM_CONF": "/etc/slurm.conf", "SBATCH_ACCOUNT": "abc",
                   "MEGATRON_CHAIN_ATTEMPT": "3", "MEGATRON_CHAIN_FAILURES": "1"}


def test_the_library_part_neither_prints_nor_exits():
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(chain))
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name not in ("main", "_say"):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    name = ast.unparse(node.func)
                    assert name not in ("print", "exit", "sys.exit", "sys.stderr.write"), \
                        f"{fn.name} calls {name}"


# srun's stderr under --kill-on-bad-exit=1, recorded on the e2e test cluster (two nodes).
KILLED_ON_N2 = """[rank1] 14:09:30 megatron.training.startup: a warning of the trainer's own
srun: error: n2: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=2070.0
srun: error: n1: task 0: Terminated
srun: Force Terminated StepId=2070.0
"""
DIVERGED_ON_N1 = """srun: error: n1: task 0: Exited with exit code 3
srun: launch/slurm: _step_signal: Terminating StepId=2070.1
srun: error: n2: task 1: Segmentation fault
srun: Force Terminated StepId=2070.1
"""
SEGFAULT_ON_N2 = """srun: error: n2: task 1: Segmentation fault
srun: launch/slurm: _step_signal: Terminating StepId=2070.2
slurmstepd-n1: error: *** STEP 2070.2 ON n1 CANCELLED AT 2026-12-01T14:09:31 ***
srun: error: n1: task 0: Terminated
"""


@pytest.mark.parametrize("text, dead", [
    (KILLED_ON_N2, [chain_nodes.DeadTask("n2", "1", "Killed")]),
    (SEGFAULT_ON_N2, [chain_nodes.DeadTask("n2", "1", "Segmentation fault")]),
    (DIVERGED_ON_N1, []),  # exit 3 is the run's own clean failure; the segfault came after
    ("srun: error: n3: tasks 8-15: Exited with exit code 1\nsrun: error: n4: task 16: Bus "
     "error\nsrun: launch/slurm: _step_signal: Terminating StepId=9.0\n",
     [chain_nodes.DeadTask("n3", "8-15", "Exited with exit code 1"),
      chain_nodes.DeadTask("n4", "16", "Bus error")]),
    ("srun: error: n1: task 0: Exited with exit code 4\nsrun: error: n2: task 1: Exited with "
     "exit code 5\nsrun: error: n2: task 2: Terminated\n", []),  # watchdog, health, stopped
    ("srun: error: Node failure on n7\n", [chain_nodes.DeadTask("n7", "all", "node failure")]),
    ("slurmstepd-n1: error: *** JOB 12 ON n1 CANCELLED AT 2026-12-01T10:00:00 DUE TO TIME "
     "LIMIT ***\nsrun: error: n1: task 0: Killed\n", []),  # srun's own kill, after the limit
])
def test_first_dead_tasks_are_the_ones_srun_names_before_ending_the_step(text, dead):
    assert chain_nodes.first_dead_tasks(text) == dead


def test_end_puts_the_node_of_the_first_dead_task_in_bad_nodes(tmp_path):
    from megatron.base.rundir import RunDir
    log = tmp_path / "srun.err"
    log.write_text(KILLED_ON_N2)
    s = chain.Settings(True, 1, 20, job=chain.JobFacts("77", str(log)))
    run = str(tmp_path / "run")
    d = chain.end(chain.Progress(run, 0, 6), 0, 137, s)
    assert d.go and "leaving out n2 (bad_nodes)" in d.message, d.message
    with open(RunDir(run).bad_nodes) as f:
        assert f.read() == "n2\tjob 77: task 1 ended first (Killed)\n"
    chain.end(chain.Progress(run, 0, 6), 0, 0, s)  # a clean exit reads nothing
    assert RunDir(run).read_bad_nodes() == ["n2"]


def test_exclusions_never_make_the_next_job_unschedulable():
    job = chain.JobFacts("1", partition="batch", nodes=2, max_excluded=8)
    assert chain_nodes.plan_exclusions(["n3"], job, ["n1", "n2", "n3"]) == (["n3"], "")
    keep, note = chain_nodes.plan_exclusions(["n1", "n2"], job, ["n1", "n2", "n3"])
    assert keep == ["n1"]
    assert "would leave 1 usable node(s) of partition batch for a 2-node job" in note, note
    assert "does not leave out n2" in note
    # A node already down counts for nobody; leaving it out costs nothing.
    assert chain_nodes.plan_exclusions(["n9"], job, ["n1", "n2"]) == (["n9"], "")
    assert chain_nodes.plan_exclusions(["n1"], job, None) == (["n1"], "")  # sinfo could not say
    with pytest.raises(InputError, match="more than MEGATRON_CHAIN_MAX_EXCLUDED=1"):
        chain_nodes.plan_exclusions(["n1", "n2"], chain.JobFacts("1", max_excluded=1), None)


def test_more_bad_nodes_than_the_cap_stop_the_chain_with_the_reason(tmp_path):
    from megatron.base.rundir import RunDir
    run = RunDir(str(tmp_path))
    for node in ("n1", "n2", "n3"):
        run.add_bad_node(node, "GEMM off")
    d = chain.end(chain.Progress(str(tmp_path), 2, 6), 0, 0,
                  chain.Settings(True, 1, 20, job=chain.JobFacts("5", max_excluded=2)))
    assert not d.go and "3 nodes were found bad" in d.message and "systematic" in d.message


def test_a_first_task_that_diverged_stops_the_chain_though_srun_says_143(tmp_path):
    """srun's own status is that of a task it ended (143); the first task's exit 3 (diverged)
    is what the next job would repeat, so the chain stops without progress."""
    log = tmp_path / "srun.err"
    log.write_text(DIVERGED_ON_N1)
    assert chain_nodes.first_exit_status(DIVERGED_ON_N1) == 3
    assert chain_nodes.first_exit_status(KILLED_ON_N2) is None
    s = chain.Settings(True, 1, 20, job=chain.JobFacts("78", str(log)))
    d = chain.end(chain.Progress(str(tmp_path / "run"), 2, 6), 2, 143, s)
    assert not d.go and "the run diverged fails the same way again" in d.message, d.message


def test_status_reads_the_run_of_the_config_yaml_it_is_given(tmp_path, monkeypatch, capsys):
    """`python -m megatron.cli.chain status --config <run dir>/config.yaml` (the README's
    question "where does my run stand"): from the folder the run started in it answers for the
    run; from anywhere else its relative run.dir names another folder, which is refused rather
    than reported as a run at step 0."""
    from megatron.cli.chain import main
    from megatron.config import load_config
    run = tmp_path / "start" / "runs" / "x"
    commit(run, 2)
    (run / "config.yaml").write_text(
        load_config(None, ["run.dir=runs/x", "training.train_iters=6"]).to_yaml())
    monkeypatch.chdir(tmp_path / "start")
    assert main(["status", "--config", "runs/x/config.yaml"]) == 0
    assert capsys.readouterr().out == "runs/x: step 2 of training.train_iters=6: not finished\n"
    monkeypatch.chdir(tmp_path)
    assert main(["status", "--config", str(run / "config.yaml")]) == 2
    assert "names another folder" in capsys.readouterr().err
