"""Chained Slurm jobs (megatron/training/chain.py, examples/frontier/chain.sh) without Slurm: the
progress read from the run directory, the begin/end decisions (finished, no progress, bound on
jobs, chaining off), the next job's sbatch line and environment. chain.sh driving the module
against stand-in squeue/sbatch: tests/integration/test_training_chain_sh.py; the chain under a
real Slurm: tests/e2e/test_training_slurm_chain.py."""
import pytest

from megatron.config.errors import InputError
from megatron.training import chain
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


def test_settings_from_the_environment():
    job = {"SLURM_JOB_ID": "7"}
    assert chain.settings(job) == ON
    s = chain.settings({**job, "MEGATRON_CHAIN_ATTEMPT": "3",
                        "MEGATRON_CHAIN_MAX_ATTEMPTS": "5"})
    assert (s.enabled, s.attempt, s.max_attempts) == (True, 3, 5)
    s = chain.settings({**job, "MEGATRON_CHAIN_FAILURES": "0", "MEGATRON_CHAIN_MAX_FAILURES": "5"})
    assert (s.failures, s.max_failures) == (0, 5)
    off = chain.settings({**job, "MEGATRON_CHAIN": "0"})
    assert not off.enabled and "MEGATRON_CHAIN=0" in off.off_reason
    assert "training.save=false" in chain.settings(job, final_save=False).off_reason
    assert "not inside a Slurm job" in chain.settings({}).off_reason


@pytest.mark.parametrize("env, name", [
    ({"MEGATRON_CHAIN_ATTEMPT": "two"}, "MEGATRON_CHAIN_ATTEMPT='two'"),
    ({"MEGATRON_CHAIN_MAX_ATTEMPTS": "0"}, "MEGATRON_CHAIN_MAX_ATTEMPTS='0'"),
    ({"MEGATRON_CHAIN": "maybe"}, "MEGATRON_CHAIN='maybe'"),
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
