"""config/unused.py: a changed setting that another setting turns off (a dense model's
moe.top_k, a spike action without a spike check, fp16's loss scaling under bf16, ...) is named
once in a start-up warning, with what turns it off; the shipped examples name none, and a setting
at its default is never named."""
import glob
import os

import pytest

from megatron.config import load_config
from megatron.config.unused import unread_note, unread_settings
from tests.support.paths import ROOT, TINY


@pytest.mark.parametrize("sets, named", [
    (["model.moe.top_k=1"], "model.moe.top_k=1 (model.moe.num_experts=0: a dense model)"),
    (["model.moe.router=sigmoid"], "model.moe.router=sigmoid (model.moe.num_experts=0"),
    (["resilience.loss_spike_action=rollback"],
     "resilience.loss_spike_action=rollback (resilience.loss_spike_factor=0: no loss-spike"),
    (["resilience.loss_spike_factor=3", "resilience.max_rollbacks=5"],
     "resilience.max_rollbacks=5 (resilience.loss_spike_action is not rollback)"),
    (["training.precision=bf16", "training.loss_scale.hysteresis=4"],
     "training.loss_scale.hysteresis=4 (only training.precision=fp16 scales the loss)"),
    (["resilience.max_loss_scale_skips=9"], "resilience.max_loss_scale_skips=9 (only"),
    (["eval.eval_iters=7"], "eval.eval_iters=7 (eval.eval_interval=0: no evaluation)"),
    (["optimizer.lr_decay_style=constant", "optimizer.lr_decay_iters=10"],
     "optimizer.lr_decay_iters=10 (optimizer.lr_decay_style=constant)"),
    (["optimizer.lr_decay_style=inverse-square-root", "optimizer.lr_decay_iters=10"],
     "optimizer.lr_decay_iters=10 (optimizer.lr_decay_style=inverse-square-root has no end)"),
    (["optimizer.lr_wsd_decay_iters=10"],
     "optimizer.lr_wsd_decay_iters=10 (optimizer.lr_decay_style is not wsd)"),
    (["parallel.sequence_parallel=true"],
     "parallel.sequence_parallel=true (parallel.tensor_parallel_size=1)"),
    (["parallel.pipeline_first_stage_layers=1"],
     "parallel.pipeline_first_stage_layers=1 (parallel.pipeline_parallel_size=1)"),
    (["model.rotary_base=500000"],
     "model.rotary_base=500000.0 (model.position_embedding_type's positions rotate no "),
    (["checkpoint.new_data_stream=true"],
     "checkpoint.new_data_stream=true (checkpoint.load is not set: a fresh start resumes no"),
    (["checkpoint.load=auto", "checkpoint.roll_back=true"],
     "checkpoint.roll_back=true (checkpoint.load=auto continues the newest checkpoint"),
])
def test_a_setting_turned_off_by_another_is_named_with_the_reason(sets, named):
    unread = unread_settings(load_config(TINY, sets))
    assert len([u for u in unread if u.startswith(named.split(" (")[0] + " ")]) == 1, unread
    assert any(u.startswith(named) for u in unread), unread
    assert named in unread_note(load_config(TINY, sets))


@pytest.mark.parametrize("sets", [
    ["model.moe.num_experts=4", "model.moe.top_k=1"],
    ["resilience.loss_spike_factor=3", "resilience.loss_spike_action=rollback",
     "resilience.max_rollbacks=5"],
    ["training.precision=fp16", "training.loss_scale.hysteresis=4"],
    ["eval.eval_interval=5", "eval.eval_iters=7"],
    ["parallel.tensor_parallel_size=2", "parallel.sequence_parallel=true"],
    ["checkpoint.load=runs/x/checkpoints/step_0000002", "checkpoint.roll_back=true"],
    ["model.position_embedding_type=rotary", "model.rotary_base=500000"],
    ["optimizer.lr_decay_style=wsd", "optimizer.lr_wsd_decay_iters=2",
     "optimizer.lr_wsd_decay_style=linear"],
    ["checkpoint.load=auto", "checkpoint.keep_data_position=true"],
])
def test_the_same_settings_where_they_are_read_are_not_named(sets):
    assert unread_settings(load_config(TINY, sets)) == []


def test_the_shipped_configs_carry_no_unread_setting():
    paths = sorted(glob.glob(os.path.join(ROOT, "examples", "*", "*.yaml")))
    assert len(paths) >= 5
    for path in paths:
        cfg = load_config(path, ["data.paths=[x]"] if "local" in path else [])
        assert unread_settings(cfg) == [], path
    assert unread_note(load_config(TINY)) == ""
