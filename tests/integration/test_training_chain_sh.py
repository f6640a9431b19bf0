"""examples/frontier/chain.sh driving megatron/training/chain.py in bash, against stand-in squeue
and sbatch (the module's decisions alone: tests/unit/test_training_chain.py; the chain under a
real Slurm: tests/e2e/test_training_slurm_chain.py)."""
import json
import os
import subprocess
import sys

from megatron.base.store import META
from tests.support.checkpoints import meta_json
from tests.support.paths import ROOT
from tests.support.chain import SEP, commit

CHAIN_SH = os.path.join(ROOT, "examples", "frontier", "chain.sh")
SBATCH = os.path.join(ROOT, "examples", "frontier", "train.sbatch")


# --- chain.sh with the module, against stand-in squeue and sbatch -----------------------------

def stand_ins(tmp_path):
    """squeue answers with the record of a 2-node job; sbatch records its argv and environment
    and answers with job id 43."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = SEP.join(["j", "(null)", "(null)", "debug", "00:10:00", "2", "(null)", "(null)",
                       str(tmp_path), f"{tmp_path}/job.sbatch tiny.yaml --set x=1"])
    (bin_dir / "squeue").write_text(f"#!/bin/sh\nprintf '%s\\n' '{record}'\n")
    (bin_dir / "sbatch").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/sbatch.argv\n'
        f"env > {tmp_path}/sbatch.env\necho 43\n")
    for tool in ("squeue", "sbatch"):
        (bin_dir / tool).chmod(0o755)
    return f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"


def run_job(tmp_path, steps_after, extra_env=None, srun_rc=0):
    """A batch script's chain calls around a stand-in training step that commits a checkpoint
    at each step in steps_after; returns (exit status, stderr)."""
    run = tmp_path / "run"
    commits = "".join(f"commit {s}\n" for s in steps_after)
    meta = json.dumps(meta_json(999, {"shards/a.pt": 3})).replace('"step": 999', '"step": %d')
    script = f"""set -euo pipefail
commit() {{
  local d={run}/checkpoints/$(printf step_%07d "$1")
  mkdir -p "$d/shards"; printf abc > "$d/shards/a.pt"; printf '{meta}' "$1" > "$d/{META}"
}}
source {CHAIN_SH}
megatron_chain_init tiny.yaml --set x=1
export NCCL_NET=Socket MEGATRON_JOB_END_TIME=1  # env.sh's, for this job only
megatron_chain_begin --set run.dir={run} --set training.train_iters=6 --set training.save=true
{commits}megatron_chain_end {srun_rc}
echo "start=$_MEGATRON_CHAIN_START" >&2
echo "continue=${{MEGATRON_CHAIN_CONTINUE[*]}}." >&2
"""
    env = {"PATH": stand_ins(tmp_path), "SLURM_JOB_ID": "42", "SLURM_NNODES": "2",
           "PYTHONPATH": ROOT, "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
           **(extra_env or {})}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env,
                         cwd=tmp_path)
    return out.returncode, out.stderr


def test_chain_sh_submits_the_same_script_again(tmp_path):
    rc, err = run_job(tmp_path, [2], {"MEGATRON_CHAIN_MAX_ATTEMPTS": "3"})
    assert rc == 0, err
    assert "job 1 of at most 3" in err and "submitting job 2" in err, err
    assert "submitted job 43 (MEGATRON_CHAIN_ATTEMPT=2)" in err and "start=0" in err
    argv = (tmp_path / "sbatch.argv").read_text().splitlines()
    assert argv == ["--parsable", "--dependency=afterany:42", "--nodes=2", "--time=00:10:00",
                    "--partition=debug", "--job-name=j", f"--chdir={tmp_path}", "--",
                    f"{tmp_path}/job.sbatch", "tiny.yaml", "--set", "x=1"]
    env = dict(line.split("=", 1) for line in
               (tmp_path / "sbatch.env").read_text().splitlines() if "=" in line)
    assert env["MEGATRON_CHAIN_ATTEMPT"] == "2" and env["MEGATRON_CHAIN_MAX_ATTEMPTS"] == "3"
    for name in ("NCCL_NET", "MEGATRON_JOB_END_TIME", "SLURM_JOB_ID", "SLURM_NNODES"):
        assert name not in env
    assert not list(tmp_path.glob("megatron-chain-env.*"))  # the snapshot is removed


def test_a_later_job_continues_the_run_whatever_the_first_was_told_to_start_from(tmp_path):
    """The training command line ends with MEGATRON_CHAIN_CONTINUE: nothing in the job you
    submit (its --set checkpoint.load=<a checkpoint> holds), checkpoint.load=auto in the jobs
    the chain submits, which get the same arguments (the first one's start would be refused
    below their run's newer checkpoints)."""
    first, later = tmp_path / "first", tmp_path / "later"
    first.mkdir(), later.mkdir()
    rc, err = run_job(first, [2])
    assert rc == 0 and "continue=." in err, err
    rc, err = run_job(later, [2], {"MEGATRON_CHAIN_ATTEMPT": "2"})
    assert rc == 0 and "continue=--set checkpoint.load=auto." in err, err


def test_chain_sh_stops_without_progress_after_a_failure_that_would_repeat(tmp_path):
    rc, err = run_job(tmp_path, [], srun_rc=2)
    assert rc == 0, err
    assert "no progress in this job" in err and "exit status 2" in err, err
    assert "a configuration or input error fails the same way again" in err, err
    assert not (tmp_path / "sbatch.argv").exists()
    assert "not submitting" in (tmp_path / "run" / "chain.log").read_text()


def test_chain_sh_tries_again_after_a_failure_before_the_first_checkpoint(tmp_path):
    rc, err = run_job(tmp_path, [], srun_rc=1)
    assert rc == 0, err
    assert "failure 1 of at most 3 in a row" in err, err
    env = dict(line.split("=", 1) for line in
               (tmp_path / "sbatch.env").read_text().splitlines() if "=" in line)
    assert env["MEGATRON_CHAIN_FAILURES"] == "1"
    log = (tmp_path / "run" / "chain.log").read_text()
    assert "submitting job 2" in log and "job " in log


def test_chain_sh_ends_a_job_of_a_finished_run_before_training(tmp_path):
    commit(tmp_path / "run", 6)
    rc, err = run_job(tmp_path, [8])
    assert rc == 0, err
    assert "the run is finished, nothing to train" in err, err
    assert "start=" not in err  # the job ended in begin
    assert not (tmp_path / "run" / "checkpoints" / "step_0000008").exists()
    assert not (tmp_path / "sbatch.argv").exists()


def test_a_misspelt_chain_variable_is_named_in_the_job_log(tmp_path):
    rc, err = run_job(tmp_path, [2], {"MEGATRON_CHAIN_MAX_ATTEMPT": "50"})
    assert rc == 0 and "job 1 of at most 20" in err, err  # it did nothing
    assert "MEGATRON_CHAIN_MAX_ATTEMPT='50' (did you mean MEGATRON_CHAIN_MAX_ATTEMPTS?)" in err


def test_chain_sh_bad_setting_fails_the_job(tmp_path):
    rc, err = run_job(tmp_path, [2], {"MEGATRON_CHAIN_MAX_ATTEMPTS": "lots"})
    assert rc == 2 and "chain: error: MEGATRON_CHAIN_MAX_ATTEMPTS='lots' is invalid" in err


def test_train_sbatch_wraps_the_training_step_in_the_chain():
    with open(SBATCH) as f:
        text = f.read()
    order = ['source "${MEGATRON_HOME}/examples/frontier/chain.sh"',
             'megatron_chain_init "${CONFIG}" "$@"',
             'source "${MEGATRON_HOME}/examples/frontier/env.sh"',
             'megatron_chain_begin --config "${CONFIG}" --set run.dir="${RUN_DIR}" "$@"',
             "megatron_job_deadline",  # after megatron_chain_init: not passed to the next job
             'python -m megatron.cli.train --config "${CONFIG}"',
             '--set checkpoint.load=auto "$@" \\\n        "${MEGATRON_CHAIN_CONTINUE[@]}" || rc=$?',
             'megatron_chain_end "${rc}"', 'exit "${rc}"']
    where = [text.find(s) for s in order]
    assert -1 not in where and where == sorted(where), list(zip(order, where))
    assert subprocess.run(["bash", "-n", CHAIN_SH]).returncode == 0
