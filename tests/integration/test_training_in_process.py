"""train() called as a library function, twice in one process (as tools and the test workers
do): the signal handlers it installs for a run are put back when it returns, the second run
resumes the first one's checkpoint in the same process group, the metrics lines read back
through the records, and the objects older than a job are frozen out of the collector until the
process leaves its group. In a fresh process: train() joins a process group that outlives it."""
import subprocess
import sys

from tests.support.cli import clean_env
from tests.support.paths import ROOT, TINY

SCRIPT = r"""
import gc, signal, sys
from megatron.base.records import read_metrics, steps, events
from megatron.base.rundir import RunDir
from megatron.config import load_config
from megatron.launch import leave_distributed
from megatron.training.loop import train

def mine(signum, frame):
    pass

signal.signal(signal.SIGTERM, mine)
before_usr1 = signal.getsignal(signal.SIGUSR1)
common = [f"run.dir={sys.argv[1]}", "training.tensorboard=false", "training.train_iters=4",
          "training.save=true"]
first = train(load_config(sys.argv[2], common + ["training.exit_interval=2"]))
assert signal.getsignal(signal.SIGTERM) is mine, signal.getsignal(signal.SIGTERM)
assert signal.getsignal(signal.SIGUSR1) == before_usr1
second = train(load_config(sys.argv[2], common + ["training.load=auto"]))
assert (first.steps, second.steps) == (2, 4), (first.steps, second.steps)
assert signal.getsignal(signal.SIGTERM) is mine
lines = read_metrics(RunDir(sys.argv[1]).metrics)
assert [r.step for r in steps(lines)] == [1, 2, 3, 4]
assert [r.step for r in events(lines, "save")] == [2, 4]
assert steps(lines)[0].startup is not None and steps(lines)[2].startup is not None
assert len(second.timing.step_s) == 2 and second.timing.startup["first_step_s"] > 0
# start() froze what existed before each job (the imports: over 100K objects), so Job.close's
# collection walks the job's own; the process's last collection sees everything again
assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()
leave_distributed()
assert gc.get_freeze_count() == 0, gc.get_freeze_count()
print("OK")
"""


def test_train_twice_in_one_process_restores_handlers_and_resumes(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "run"), TINY], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
