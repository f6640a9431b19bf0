"""A run that would save below a complete checkpoint of its own run.dir is refused before it
writes anything (checkpoint/layout.check_continues_newest): checkpoint.load=auto, which every
chained job and every resumed run uses, takes the highest step, so such a run's saves would be
passed over for the older history's (or set it aside when they reach its step). Every way to
start below it: a fresh start (the same command run again without checkpoint.load), a fresh start
from checkpoint.init_from, checkpoint.load naming an older checkpoint of the run (a rollback) or
another run's checkpoint. Continuing the newest (auto, or naming it) still trains. One process,
train() called in turn, as a library user would."""
from tests.support.cli import script_result
from tests.support.paths import TINY

SCRIPT = r"""
import hashlib, json, os, sys
from megatron.cli.convert import main as convert_main
from megatron.config import load_config
from megatron.config.errors import InputError
from megatron.launch import leave_distributed
from megatron.training.loop import train

tmp, tiny = sys.argv[1], sys.argv[2]
run, other = os.path.join(tmp, "run"), os.path.join(tmp, "other")
common = ["training.tensorboard=false", "checkpoint.save=true", "checkpoint.save_interval=1"]

def cfg(run_dir, *sets):
    return load_config(tiny, common + [f"run.dir={run_dir}", *sets])

def snapshot(run_dir):
    out = {}
    for root, _, files in os.walk(run_dir):
        for name in files:
            if name != ".lock":
                path = os.path.join(root, name)
                out[os.path.relpath(path, run_dir)] = hashlib.sha256(
                    open(path, "rb").read()).hexdigest()
    return out

train(cfg(run, "training.train_iters=3"))
train(cfg(other, "training.train_iters=2"))
assert convert_main(["to-single", "--run-dir", other, "--output",
                     os.path.join(tmp, "other.pt")]) == 0
before = snapshot(run)
refusals = {}
for name, sets in {
        "fresh": ["training.train_iters=4"],
        "init_from": ["training.train_iters=4", f"checkpoint.init_from={tmp}/other.pt"],
        "rollback": ["training.train_iters=4",
                     f"checkpoint.load={run}/checkpoints/step_0000002"],
        "another run's": ["training.train_iters=4", f"checkpoint.load={other}/checkpoints"],
}.items():
    try:
        train(cfg(run, *sets))
        refusals[name] = None
    except InputError as e:
        refusals[name] = str(e)
unchanged = snapshot(run) == before
named = train(cfg(run, "training.train_iters=4",
                  f"checkpoint.load={run}/checkpoints/step_0000003")).steps
auto = train(cfg(run, "training.train_iters=5", "checkpoint.load=auto")).steps
leave_distributed()
print("RESULT " + json.dumps({"refusals": refusals, "unchanged": unchanged,
                              "steps": [named, auto]}))
"""


def test_a_run_starting_below_its_run_dirs_newest_checkpoint_is_refused(tmp_path):
    out = script_result(SCRIPT, str(tmp_path), TINY)
    refusals = out["refusals"]
    newest = f"run.dir '{tmp_path}/run' holds a complete checkpoint at step 3"
    for name, message in refusals.items():
        assert message is not None and message.startswith(newest), (name, message)
        assert "--set run.dir=..." in message, (name, message)
    for name in ("fresh", "init_from"):
        assert "this run starts afresh" in refusals[name]
    for message in refusals.values():
        assert "--set checkpoint.load=auto" in message
    assert "checkpoint.init_from only starts a run" in refusals["init_from"]
    assert "step_0000002, step 2" in refusals["rollback"]
    assert "move the checkpoints above step 2 out of" in refusals["rollback"]
    assert "other/checkpoints/step_0000002, step 2" in refusals["another run's"]
    assert out["unchanged"], "a refused run wrote into the run directory"
    assert out["steps"] == [4, 5]
