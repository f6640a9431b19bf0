"""A run that would save below a complete checkpoint of its own run.dir is refused before it
writes anything (checkpoint/layout.check_continues_newest): checkpoint.load=auto, which every
chained job and every resumed run uses, takes the highest step, so such a run's saves would be
passed over for the older history's (or set it aside when they reach its step). Every way to
start below it: a fresh start (the same command run again without checkpoint.load), a fresh start
from checkpoint.init_from, checkpoint.load naming an older checkpoint of the run (a rollback) or
another run's checkpoint. Continuing the newest (auto, or naming it) still trains, and
checkpoint.roll_back=true moves the newer checkpoints aside instead of refusing. One process,
train() called in turn, as a library user would, shared by the module's tests."""
import pytest

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

first = train(cfg(run, "training.train_iters=3")).losses
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
ckpts = os.path.join(run, "checkpoints")
kept = snapshot(ckpts)
# checkpoint.roll_back: back to step 2 of 5, then on from the rollback's newest
rolled = train(cfg(run, "training.train_iters=4", f"checkpoint.load={ckpts}/step_0000002",
                   "checkpoint.roll_back=true"))
after = {"checkpoints": sorted(os.listdir(ckpts)),
         "latest": open(os.path.join(ckpts, "latest")).read(),
         "aside": [(d, sorted(os.listdir(os.path.join(run, "rolled_back", d))))
                   for d in os.listdir(os.path.join(run, "rolled_back"))]}
from megatron.base.records import read_metrics
events = [r for r in read_metrics(os.path.join(run, "metrics.jsonl"))
          if getattr(r, "event", None) == "rollback"]
after["events"] = [[e.step, e.to_step, e.reason] for e in events]
recorded = load_config(os.path.join(run, "config.yaml")).checkpoint
after["recorded"] = [recorded.load, recorded.roll_back]  # the rollback recorded as done
moved = snapshot(os.path.join(run, "rolled_back", after["aside"][0][0]))
intact = all(moved[k] == kept[k] for k in moved)
then = train(cfg(run, "training.train_iters=5", "checkpoint.load=auto")).steps
afresh = train(cfg(run, "training.train_iters=1", "checkpoint.roll_back=true")).losses
leave_distributed()
print("RESULT " + json.dumps({"refusals": refusals, "unchanged": unchanged,
                              "steps": [named, auto, rolled.steps, then], "first": first,
                              "rolled": rolled.losses, "after": after, "intact": intact,
                              "afresh": afresh,
                              "aside": sorted(os.listdir(os.path.join(run, "rolled_back")))}))
"""


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    return tmp, script_result(SCRIPT, str(tmp), TINY)


def test_a_run_starting_below_its_run_dirs_newest_checkpoint_is_refused(result):
    tmp_path, out = result
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
    assert "to roll back, --set checkpoint.roll_back=true moves the checkpoints above step 2 " \
        "out of" in refusals["rollback"]
    assert "checkpoint.roll_back=true to move its checkpoints out of" in refusals["fresh"]
    assert "other/checkpoints/step_0000002, step 2" in refusals["another run's"]
    assert out["unchanged"], "a refused run wrote into the run directory"
    assert out["steps"][:2] == [4, 5]


def test_roll_back_moves_the_newer_checkpoints_aside_and_trains_the_same_steps_again(result):
    """checkpoint.roll_back=true with checkpoint.load naming step 2 of the run's 5: steps 3-5
    are moved whole into rolled_back/<time>-above-step_0000002/, steps 3 and 4 are trained again
    exactly (the first history's losses), `latest` names the rollback's step 4 and auto goes on
    from there; a fresh start with it moves every checkpoint aside and trains step 1 again."""
    tmp_path, out = result
    steps, after = out["steps"], out["after"]
    assert steps[2:] == [4, 5], steps  # the rollback trained to 4, auto then to 5
    assert after["checkpoints"] == ["latest", "step_0000001", "step_0000002", "step_0000003",
                                    "step_0000004"], after
    assert after["latest"] == "step_0000004"
    assert after["recorded"] == [f"{tmp_path}/run/checkpoints/step_0000002", False]
    (step, to_step, reason), = after["events"]  # metrics.jsonl's record, for megatron-report
    assert (step, to_step) == (5, 2) and reason.startswith(
        "checkpoint.roll_back: 3 checkpoint folder(s) above step 2 moved into "), reason
    (name, moved), = after["aside"]
    assert name.endswith("-above-step_0000002"), name
    assert moved == ["step_0000003", "step_0000004", "step_0000005"]
    assert out["intact"], "a moved checkpoint's files changed"
    first, rolled = out["first"], out["rolled"]
    assert len(rolled) == 2 and rolled[0] == pytest.approx(first[2], rel=1e-6), (first, rolled)
    assert out["afresh"] == [pytest.approx(first[0], rel=1e-6)]
    assert len(out["aside"]) == 2, out
    assert any(name.endswith("-above-step_0000000") for name in out["aside"]), out
