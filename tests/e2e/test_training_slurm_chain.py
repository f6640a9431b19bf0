"""Chained jobs under a real Slurm with two fake nodes (the session fixture `slurm`):
examples/frontier/train.sbatch itself (env.sh, chain.sh), with only its #SBATCH lines and srun
options made to fit this machine, trains the tiny model on the CPU. Each job stops early at
training.exit_interval=2 of training.train_iters=6 and submits the script again.

- A first chain on 2 nodes, bounded to one job (MEGATRON_CHAIN_MAX_ATTEMPTS=1), trains steps 1-2
  and stops there; the run is then submitted again on 1 node (what a person does to move a chain
  to another node count), naming its step-2 checkpoint as the one to start from
  (checkpoint.load=<folder>), and that chain submits itself until step 6 (its second job
  continues from step 4, not from the named step 2 again): 3 jobs in all, each loss equal to an
  uninterrupted run's. Submitted once more, the finished run trains nothing.
- A chain whose first job rolls back (checkpoint.roll_back to step 2 of 4) counts the steps it
  trains again as progress and goes on from the rollback's history to the end.
- A job that makes no progress (its run directory is locked by another run) does not submit
  another.
If a chain breaks, look first at the job logs the assertion prints (lines starting `chain:`)."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from megatron.base.rundir import RunLock
from tests.e2e.e2e_helpers import ROOT, TINY, RunEnv, set_args, train_steps
from tests.e2e.slurm_cluster import ENDED
from tests.support.procs import pid_of
from megatron.base.records import read_metrics, steps
from megatron.base.rundir import RunDir
from megatron.base.store import committed

pytestmark = pytest.mark.slow

SBATCH = os.path.join(ROOT, "examples", "frontier", "train.sbatch")
FRONTIER_SRUN = "srun --ntasks-per-node=8 --gpus-per-node=8 --gpu-bind=closest -c 7"


def job_script(out) -> str:
    """examples/frontier/train.sbatch as it is, but for this machine: its #SBATCH lines (8 GPUs a
    node, an account, Slingshot) replaced by one task a node, and its srun options by none."""
    with open(SBATCH) as f:
        text = f.read()
    assert text.count(FRONTIER_SRUN) == 1, "train.sbatch's training srun line changed"
    body = "\n".join(line for line in text.replace(FRONTIER_SRUN, "srun").splitlines()
                     if not line.startswith("#SBATCH"))
    return body.replace("#!/bin/bash\n", "#!/bin/bash\n#SBATCH --ntasks-per-node=1\n"
                        f"#SBATCH --output={out}/%j.out\n", 1) + "\n"


# fp32, no dropout: a continued run computes exactly what an uninterrupted one does.
TRAIN = set_args("training.train_iters=6", "training.global_batch_size=4", "training.save=true",
                 "training.tensorboard=false", "model.hidden_dropout=0.0",
                 "model.attention_dropout=0.0")


class Chain:
    """Submits the script under one job name and waits until no job of that name is left in
    the queue: each job submits the next before it ends, so an empty queue is the chain's end."""

    def __init__(self, slurm, tmp_path, run_dir, name):
        self.run_env, self.name = RunEnv(tmp_path), name
        self.out = tmp_path / "jobs"
        self.out.mkdir()
        self.script = tmp_path / "train.sbatch"
        self.script.write_text(job_script(self.out))
        # No modules here; the fake node names do not resolve.
        self.env = dict(self.run_env.env, SLURM_CONF=slurm["conf"], MEGATRON_HOME=ROOT,
                        MEGATRON_MODULES="", RUN_DIR=str(run_dir), MASTER_ADDR="127.0.0.1")

    def run(self, nodes: int, *args, timeout: float = 150, sbatch=(), **env):
        before = set(self.out.iterdir())
        proc = subprocess.run(["sbatch", "--parsable", f"--nodes={nodes}", *sbatch,
                               f"--job-name={self.name}", f"--chdir={ROOT}", str(self.script),
                               TINY, *args],
                              capture_output=True, text=True, env=dict(self.env, **env), timeout=60)
        assert proc.returncode == 0, proc.stderr
        deadline = time.monotonic() + timeout
        while self._queued():
            if time.monotonic() > deadline:
                subprocess.run(["scancel", f"--name={self.name}"], env=self.env)
                pytest.fail(f"chain {self.name} still running after {timeout:.0f} s:\n"
                            f"{self.logs(before)}")
            time.sleep(0.3)
        jobs = sorted(int(p.stem) for p in set(self.out.iterdir()) - before)
        return [(job, self._state(job), (self.out / f"{job}.out").read_text()) for job in jobs]

    def logs(self, before=()):
        return "\n".join(f"--- job {p.stem}\n{p.read_text()[-3000:]}"
                         for p in sorted(set(self.out.iterdir()) - set(before)))

    def _queued(self) -> bool:
        out = subprocess.run(["squeue", "-h", f"--name={self.name}", "-o", "%i %T"],
                             capture_output=True, text=True, env=self.env).stdout
        return any(state not in ENDED for state in out.split()[1::2])

    def _state(self, job: int) -> str:
        out = subprocess.run(["scontrol", "-o", "show", "job", str(job)], capture_output=True,
                             text=True, env=self.env).stdout
        fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
        return f"{fields.get('JobState')} {fields.get('ExitCode')}"


def losses(run_dir):
    return {r.step: r.loss for r in steps(read_metrics(RunDir(str(run_dir)).metrics))}


def test_chain_resubmits_until_train_iters_with_an_uninterrupted_runs_losses(slurm, tmp_path):
    run_dir, ref_dir = tmp_path / "run", tmp_path / "ref"
    c = Chain(slurm, tmp_path, run_dir, f"chain-{tmp_path.name}")
    reference = subprocess.Popen(
        [sys.executable, "-m", "megatron.cli.train", "--config", TINY, *TRAIN,
         *set_args(f"run.dir={ref_dir}")], cwd=ROOT, env=c.run_env.env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        stop_at_2 = set_args("training.exit_interval=2")
        first = c.run(2, *TRAIN, *stop_at_2, MEGATRON_CHAIN_MAX_ATTEMPTS="1")
        assert [s for _, s, _ in first] == ["COMPLETED 0:0"], c.logs()
        log = first[0][2]
        assert "(slurm, 2 node(s)" in log and "chain: job 1 of at most 1" in log, log[-3000:]
        assert "step 2 of training.train_iters=6: this was job 1 of at most 1" in log, log[-3000:]
        assert train_steps(str(run_dir)) == [1, 2]

        step_2 = set_args(f"checkpoint.load={run_dir / 'checkpoints' / 'step_0000002'}")
        rest = c.run(1, *TRAIN, *stop_at_2, *step_2)
        assert [s for _, s, _ in rest] == ["COMPLETED 0:0"] * 2, c.logs()
        (_, _, one), (_, _, two) = rest
        assert "(slurm, 1 node(s)" in one and "(slurm, 1 node(s)" in two
        assert "continuing from step 2" in one and "submitting job 2" in one, one[-3000:]
        assert "job 2 of at most 20" in two and "continuing from step 4" in two, two[-3000:]
        assert "the run is finished after 2 job(s) of this chain" in two, two[-3000:]
        assert train_steps(str(run_dir)) == [1, 2, 3, 4, 5, 6]  # no step lost or repeated

        again = c.run(1, *TRAIN, *stop_at_2)
        assert [s for _, s, _ in again] == ["COMPLETED 0:0"], c.logs()
        assert "the run is finished, nothing to train" in again[0][2]
        assert "rank 0 of" not in again[0][2]  # ended before the training step
        c.run_env.assert_compiled_nothing(c.logs())
    finally:
        ref_out = reference.communicate(timeout=300)[0]
    assert reference.returncode == 0, ref_out[-3000:]
    got, want = losses(run_dir), losses(ref_dir)
    assert sorted(got) == sorted(want) == [1, 2, 3, 4, 5, 6]
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-5), (step, got, want)


def test_a_chain_that_rolls_back_goes_on_from_its_rollback(slurm, tmp_path):
    """checkpoint.roll_back in a chain's first job: steps 1-4 trained (two one-job chains), then
    a chain submitted with checkpoint.load=<step 2> and roll_back=true. Its job 1 moves steps 3-4
    aside, trains them again to the same losses and counts that as progress (from step 2, not
    from the newest it moved: training/chain.rollback_start); its job 2 continues the rollback's
    history (checkpoint.load=auto after the arguments) to step 6."""
    run_dir = tmp_path / "run"
    c = Chain(slurm, tmp_path, run_dir, f"rollback-{tmp_path.name}")
    stop_at_2 = set_args("training.exit_interval=2", "checkpoint.save_interval=1")
    for _ in range(2):
        jobs = c.run(1, *TRAIN, *stop_at_2, MEGATRON_CHAIN_MAX_ATTEMPTS="1")
        assert [s for _, s, _ in jobs] == ["COMPLETED 0:0"], c.logs()
    assert train_steps(str(run_dir)) == [1, 2, 3, 4]
    back = set_args(f"checkpoint.load={run_dir / 'checkpoints' / 'step_0000002'}",
                    "checkpoint.roll_back=true")
    (_, s1, one), (_, s2, two) = c.run(1, *TRAIN, *stop_at_2, *back)
    assert (s1, s2) == ("COMPLETED 0:0", "COMPLETED 0:0"), c.logs()
    assert "continuing from step 2" in one and "moved 2 checkpoint folder(s)" in one, one[-3000:]
    assert "this job trained from step 2" in one and "submitting job 2" in one, one[-3000:]
    assert "continuing from step 4" in two and "the run is finished" in two, two[-3000:]
    (aside,) = (run_dir / "rolled_back").iterdir()
    assert sorted(p.name for p in aside.iterdir()) == ["step_0000003", "step_0000004"]
    history = [(r.step, r.loss) for r in steps(read_metrics(RunDir(str(run_dir)).metrics))]
    assert [step for step, _ in history] == [1, 2, 3, 4, 3, 4, 5, 6]
    assert history[4][1] == pytest.approx(history[2][1], rel=1e-5), history  # step 3 again


def test_chain_stops_when_a_job_makes_no_progress(slurm, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    c = Chain(slurm, tmp_path, run_dir, f"stuck-{tmp_path.name}")
    lock = RunLock(str(run_dir))  # another run holds the directory: every job would be refused
    lock.acquire()
    try:
        jobs = c.run(1, *TRAIN, *set_args("training.exit_interval=2"))
    finally:
        lock.release()
    assert [s for _, s, _ in jobs] == ["FAILED 2:0"], c.logs()
    log = jobs[0][2]
    assert "is in use by another run" in log, log[-3000:]
    assert "no progress in this job (it started from step 0; exit status 2): not submitting" \
        in log, log[-3000:]
    assert not (run_dir / "checkpoints").exists() or not os.listdir(run_dir / "checkpoints")


def _kill_rank_once(run_dir: str, procid: str, done: threading.Event, killed: list):
    """kill -9 the first training task of this run with SLURM_PROCID=procid (a node lost)."""
    while not done.is_set() and not killed:
        pid = pid_of("megatron.cli.train", f"run.dir={run_dir}", env_has=f"SLURM_PROCID={procid}")
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.05)


def test_a_job_that_loses_a_rank_before_its_first_checkpoint_is_followed(slurm, tmp_path):
    """Issue 20 item 6: the chain goes on after a job that failed before its first checkpoint
    (rank 1 killed at start-up; --kill-on-bad-exit ends the step), and finishes the run with an
    uninterrupted run's losses; chain.log in the run directory records both decisions."""
    run_dir, ref_dir = tmp_path / "run", tmp_path / "ref"
    c = Chain(slurm, tmp_path, run_dir, f"lost-{tmp_path.name}")
    reference = subprocess.Popen(
        [sys.executable, "-m", "megatron.cli.train", "--config", TINY, *TRAIN,
         *set_args(f"run.dir={ref_dir}")], cwd=ROOT, env=c.run_env.env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_rank_once, args=(str(run_dir), "1", done, killed))
    killer.start()
    try:
        jobs = c.run(2, *TRAIN, timeout=240)
    finally:
        done.set()
        killer.join()
        ref_out = reference.communicate(timeout=300)[0]
    assert killed, "no rank 1 was found to kill"
    states = [s for _, s, _ in jobs]
    assert len(states) == 2 and states[0].startswith("FAILED") and states[1] == "COMPLETED 0:0", \
        c.logs()
    assert "failure 1 of at most 3 in a row" in jobs[0][2], jobs[0][2][-3000:]
    assert "the run is finished after 2 job(s)" in jobs[1][2], jobs[1][2][-3000:]
    chain_log = (run_dir / "chain.log").read_text()
    assert "submitting job 2" in chain_log and "the run is finished" in chain_log, chain_log
    # srun named n2's task 1 first (--kill-on-bad-exit then ended n1's), so n2 is a bad node;
    # but a 2-node job on this 2-node partition cannot leave it out, so job 2 keeps it.
    assert RunDir(str(run_dir)).read_bad_nodes() == ["n2"]
    assert "task 1 ended first (Killed)" in (run_dir / "bad_nodes").read_text()
    guard = "would leave 1 usable node(s) of partition debug for a 2-node job"
    assert guard in jobs[0][2] and guard in chain_log, chain_log
    assert "does not leave out n2" in chain_log, chain_log
    assert reference.returncode == 0, ref_out[-3000:]
    got, want = losses(run_dir), losses(ref_dir)
    assert sorted(got) == sorted(want) == [1, 2, 3, 4, 5, 6]
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-5), (step, got, want)


def test_the_node_of_a_killed_rank_is_left_out_of_the_next_job(slurm, tmp_path):
    """Issue 20 item 4: job 1 runs 2 ranks on n1 of the 2 nodes (n2 the spare); rank 1 is killed
    with SIGKILL at start-up (a node lost). srun names n1's task 1 first; the chain puts n1 in
    bad_nodes and job 2 (1 task a node, as the script says) trains the run to its end on n2."""
    run_dir = tmp_path / "run"
    c = Chain(slurm, tmp_path, run_dir, f"dead-{tmp_path.name}")
    done, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_rank_once, args=(str(run_dir), "1", done, killed))
    killer.start()
    try:
        jobs = c.run(1, *TRAIN, sbatch=["--nodelist=n1", "--ntasks-per-node=2"], timeout=240)
    finally:
        done.set()
        killer.join()
    assert killed, "no rank 1 was found to kill"
    states = [s for _, s, _ in jobs]
    assert len(states) == 2 and states[0].startswith("FAILED") and states[1] == "COMPLETED 0:0", \
        c.logs()
    first, second = jobs[0][2], jobs[1][2]
    assert "srun: error: n1: task 1: Killed" in first, first[-3000:]
    assert "leaving out n1 (bad_nodes)" in first, first[-3000:]
    assert "the run is finished" in second, second[-3000:]
    with open(RunDir(str(run_dir)).bad_nodes) as f:
        lines = f.read().splitlines()
    assert lines == [f"n1\tjob {jobs[0][0]}: task 1 ended first (Killed)"], lines
    assert " on n2: " in (run_dir / "chain.log").read_text()  # job 2's decision, made on n2
    assert train_steps(str(run_dir)) == [1, 2, 3, 4, 5, 6]


def test_a_node_that_fails_its_health_check_is_left_out_of_the_next_job(slurm, tmp_path):
    """Issue 20 item 3: job 1 lands on n1, whose health check (MEGATRON_HEALTH_CHECK, the test's
    stand-in for a faulty GPU) fails; the job ends at start-up with exit 5 naming n1, the chain
    submits job 2 with --exclude=n1, and job 2 trains the run to its end on n2."""
    run_dir = tmp_path / "run"
    c = Chain(slurm, tmp_path, run_dir, f"badnode-{tmp_path.name}")
    check = 'test "$SLURMD_NODENAME" != n1 || { echo "n1: GPU 0 ECC errors" >&2; exit 1; }'
    jobs = c.run(1, *TRAIN, sbatch=["--nodelist=n1"], timeout=240, MEGATRON_HEALTH_CHECK=check)
    states = [s for _, s, _ in jobs]
    assert len(states) == 2 and states[0] == "FAILED 5:0" and states[1] == "COMPLETED 0:0", \
        c.logs()
    first, second = jobs[0][2], jobs[1][2]
    assert "node n1 (rank 0) failed its health check" in first and "ECC errors" in first, first
    assert "leaving out the node(s) named in bad_nodes: n1" in first, first[-3000:]
    assert "the run is finished" in second, second[-3000:]
    assert RunDir(str(run_dir)).read_bad_nodes() == ["n1"]
    assert " on n2: " in (run_dir / "chain.log").read_text()  # job 2's decision, made on n2
    assert train_steps(str(run_dir)) == [1, 2, 3, 4, 5, 6]


def _stop_rank_once(run_dir: str, procid: str, done: threading.Event, stopped: list):
    """SIGSTOP this run's training task with SLURM_PROCID=procid once the run has committed a
    checkpoint: past its first save, which the watchdog allows start-up's limit (a stop inside
    it would wait training.startup_timeout_minutes, not the hang limit this test sets)."""
    run = RunDir(run_dir)
    while not done.is_set() and not stopped:
        pid = pid_of("megatron.cli.train", f"run.dir={run_dir}", env_has=f"SLURM_PROCID={procid}")
        if pid is not None and committed(run.checkpoints):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
            return
        time.sleep(0.02)


def test_a_stopped_task_ends_its_job_and_the_chain_goes_on(slurm, tmp_path):
    """Issue 20: rank 1 of job 1 is stopped (SIGSTOP) mid-run; rank 0's watchdog (30 s) names it
    unresponsive, --kill-on-bad-exit ends the step, the chain submits job 2 (n2 stays in: the
    2-node partition cannot spare it), which resumes from the last checkpoint and finishes with
    an uninterrupted run's losses."""
    run_dir, ref_dir = tmp_path / "run", tmp_path / "ref"
    c = Chain(slurm, tmp_path, run_dir, f"stopped-{tmp_path.name}")
    train = set_args("training.train_iters=30", "training.global_batch_size=4",
                     "training.save=true", "training.save_interval=2", "training.tensorboard=false",
                     "model.hidden_dropout=0.0", "model.attention_dropout=0.0",
                     "training.hang_timeout_minutes=0.5",
                     # should the stop still land in a save the watchdog counts as the first
                     # (start-up's limit), the job ends within a minute, not 30
                     "training.startup_timeout_minutes=1")
    reference = subprocess.Popen(
        [sys.executable, "-m", "megatron.cli.train", "--config", TINY, *train,
         *set_args(f"run.dir={ref_dir}")], cwd=ROOT, env=c.run_env.env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done, stopped = threading.Event(), []
    stopper = threading.Thread(target=_stop_rank_once, args=(str(run_dir), "1", done, stopped))
    stopper.start()
    try:
        jobs = c.run(2, *train, timeout=300)
    finally:
        done.set()
        stopper.join()
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        ref_out = reference.communicate(timeout=300)[0]
    assert stopped, "no rank 1 was found to stop"
    states = [s for _, s, _ in jobs]
    assert len(states) == 2 and states[0].startswith("FAILED") and states[1] == "COMPLETED 0:0", \
        c.logs()
    assert "never reported" in jobs[0][2] and "submitting job 2" in jobs[0][2], jobs[0][2][-3000:]
    (gone,) = [e for e in read_metrics(RunDir(str(run_dir)).metrics)
               if getattr(e, "event", None) == "unresponsive"]
    assert gone.ranks == [1] and gone.nodes == ["n2"]
    assert reference.returncode == 0, ref_out[-3000:]
    got, want = losses(run_dir), losses(ref_dir)
    assert sorted(got) == sorted(want) == list(range(1, 31))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-5), (step, got, want)
