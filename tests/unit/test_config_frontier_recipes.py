"""examples/frontier: every recipe loads strictly and validates for the world its launch line
implies (nodes x ranks per node of train.sbatch), carries the paper's shapes and optimizer, and
env.sh cites a source for every setting. The scripts run through bash (the Frontier conventions
of train.sbatch and env.sh): tests/integration/test_launch_frontier_recipes_run.py."""
import os
import re

import pytest

from megatron.config import load_config, validate_for_world
from megatron.launch import frontier_env
from tests.support.frontier import ENV_SH, FRONTIER, RECIPES, launch_nodes, ranks_per_node, read

@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_validates_for_its_launch(recipe):
    shape, (tp, pp), nodes, dp = RECIPES[recipe]
    cfg = load_config(os.path.join(FRONTIER, recipe))
    assert launch_nodes(recipe) == nodes
    world = nodes * ranks_per_node()
    assert validate_for_world(cfg, world) == dp
    m = cfg.model
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == shape
    assert (cfg.parallel.tensor_parallel_size, cfg.parallel.pipeline_parallel_size) == (tp, pp)
    assert tp <= 8, "tensor parallelism must stay inside one 8-GCD node"
    assert world % 8 == 0


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_recipe_carries_the_papers_training_setup(recipe):
    cfg = load_config(os.path.join(FRONTIER, recipe))
    o, t, m, d = cfg.optimizer, cfg.training, cfg.model, cfg.data
    assert (o.lr, o.min_lr, o.lr_decay_style, o.weight_decay) == (6e-5, 6e-6, "cosine", 0.1)
    assert (o.adam_beta1, o.adam_beta2, t.clip_grad) == (0.9, 0.95, 1.0)
    assert (m.seq_length, m.vocab_size, m.attention_backend) == (2048, 50257, "flash")
    assert (t.precision, t.activation_checkpointing, t.micro_batch_size) == ("bf16", "full", 1)
    assert cfg.parallel.zero_stage == 1 and cfg.checkpoint.save
    assert (d.synthetic, d.tokenizer_type) == (False, "gpt2")
    assert d.paths and d.vocab_file and d.merges_file


def _holds_the_quoted_prediction(recipe, cfg, nodes, step_pattern):
    """The header's "predicts X GB per GCD ... <step_pattern>" are `megatron-plan memory`'s
    figures for the recipe on its nodes, and it fits."""
    import contextlib
    import io
    from megatron.cli.plan import main as plan
    header = read(os.path.join(FRONTIER, recipe))
    quoted = re.search(r"predicts ([\d.]+) GB per GCD .* " + step_pattern, header, re.S)
    assert quoted, "the header quotes the planner's memory and step"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        plan(["memory", "--config", os.path.join(FRONTIER, recipe), "--cluster", "frontier",
              "--nodes", str(nodes), "--global-batch", str(cfg.training.global_batch_size)])
    text = out.getvalue()
    assert f"{quoted.group(1)} GB allocated at peak" in text and "fits" in text, text
    assert f"step {quoted.group(2)} s" in text, text


def test_the_mixtral_recipe_validates_and_the_planner_fits_it():
    """examples/frontier/mixtral-8x7b.yaml: the Mixtral-8x7B shape, EP 8 inside a node on the
    ranks its launch line gives, and the planner's prediction its header quotes."""
    recipe = "mixtral-8x7b.yaml"
    cfg = load_config(os.path.join(FRONTIER, recipe))
    m, p = cfg.model, cfg.parallel
    assert (m.num_layers, m.hidden_size, m.num_query_groups, m.ffn_hidden_size) == \
        (32, 4096, 8, 14336)
    assert (m.moe.num_experts, m.moe.top_k, m.moe.router) == (8, 2, "softmax_renorm")
    nodes = launch_nodes(recipe)
    assert validate_for_world(cfg, nodes * ranks_per_node()) == 256
    assert p.expert_parallel_size <= ranks_per_node(), "the all-to-all stays inside a node"
    _holds_the_quoted_prediction(recipe, cfg, nodes, r"an ([\d.]+) s step")


def test_the_llama31_recipe_is_the_published_model_and_the_planner_fits_it():
    """examples/frontier/llama3.1-8b-cpt.yaml: the model section megatron-convert from-hf makes
    of Llama 3.1 8B's published config.json, field for field, starting from its weights; TP
    inside a node on the ranks its launch line gives; the planner's prediction its header
    quotes."""
    from megatron.config.hf_models import hf_model_config
    from tests.support.hf_configs import HF_CONFIGS
    recipe = "llama3.1-8b-cpt.yaml"
    cfg = load_config(os.path.join(FRONTIER, recipe))
    published = hf_model_config(HF_CONFIGS["llama3.1-8b"], "config.json",
                                seq_length=cfg.model.seq_length).model
    ours = dict(cfg.model.__dict__, attention_backend=published.attention_backend,
                init_method_std=published.init_method_std)
    assert ours == published.__dict__
    assert cfg.checkpoint.init_from and cfg.data.tokenizer_type == "huggingface"
    nodes = launch_nodes(recipe)
    assert validate_for_world(cfg, nodes * ranks_per_node()) == 32
    assert cfg.parallel.tensor_parallel_size <= 2, "TP inside one MI250X package"
    _holds_the_quoted_prediction(recipe, cfg, nodes, r"a ([\d.]+) s\s+# step")


def test_175b_is_the_logged_run():
    cfg = load_config(os.path.join(FRONTIER, "175b.yaml"))
    assert cfg.training.global_batch_size == 1280
    assert validate_for_world(cfg, 128) == 2  # TP4 x PP16 x DP2 on 128 GCDs


def test_1t_head_dim_is_128():
    assert load_config(os.path.join(FRONTIER, "1t.yaml")).model.head_dim == 128


def test_every_setting_cites_its_source():
    lines = read(ENV_SH).splitlines()
    for i, line in enumerate(lines):
        if line.startswith("export ") and any(f"export {s.name}=" in line
                                                for s in frontier_env.SETTINGS):
            comment = []
            for prev in reversed(lines[:i]):
                if not prev.startswith("#"):
                    break
                comment.insert(0, prev)
            cited = " ".join(comment)
            assert re.search(r"\[(OLCF-PT|OLCF-FUG|OLCF-SB|HPE|OFI) ", cited), line
