"""Set first/last stage layer counts (Layout.first_stage_layers, last_stage_layers; Megatron-LM's
--decoder-first/last-pipeline-num-layers) priced in memory and time, against hand sums."""
import dataclasses

import numpy as np
import pytest

from megatron.config.schedules.one_f_one_b import in_flight
from megatron.planner import activations as act
from megatron.planner.layout import Job, Layout, layout_problem, layout_stage_layers
from megatron.planner.memory import GIB, memory_per_stage, peak_memory
from megatron.planner.models import preset_model
from megatron.planner.params import layer_params, stage_params
from megatron.planner.profile import Constants, load_profile
from megatron.planner.timing import _Ctx, dot, stage_features, step_time, theta

M = preset_model("175b")   # 96 layers
JOB = Job(M, 1280, "bf16")
EVEN = Layout(tp=8, pp=8, dp=2, micro_batch=1, grad_accum=640, zero=1, recompute="full")
UNEVEN = dataclasses.replace(EVEN, first_stage_layers=9, last_stage_layers=9)


def test_the_rest_is_split_evenly_over_the_middle_stages():
    assert layout_stage_layers(96, UNEVEN) == [9] + [13] * 6 + [9]
    assert layout_stage_layers(96, dataclasses.replace(EVEN, first_stage_layers=5)) == \
        [5] + [13] * 7
    assert layout_stage_layers(96, EVEN) == [12] * 8
    assert UNEVEN.key().endswith("-first9-last9") and "first" not in EVEN.key()


@pytest.mark.parametrize("kw,needle", [
    (dict(first_stage_layers=4, last_stage_layers=4), "not an even split"),
    (dict(first_stage_layers=0), "at least 1 layer each"),
    (dict(first_stage_layers=9, interleave=2), "other model chunk(s) of the 8 x 2"),
])
def test_a_split_megatron_would_refuse_is_refused_in_one_line(kw, needle):
    assert needle in layout_problem(JOB, dataclasses.replace(EVEN, **kw))


def test_a_middle_stage_holds_its_layers_and_decides_the_peak():
    """Stage 1: 13 layers' parameters and 1F1B's p - 1 = 7 micro-batches of 13 layers' stored
    input (full recompute) plus the stage output; it, not an end, is the busiest."""
    c = Constants()
    stages = memory_per_stage(JOB, UNEVEN, c)
    assert stages[1].params == 13 * layer_params(M, 8)
    per_mb = 13 * act.layer_stored_bytes(M, UNEVEN, "bf16") + act.boundary_bytes(M, UNEVEN,
                                                                                 "bf16")
    assert stages[1].activations == pytest.approx(in_flight(UNEVEN.pipe, 1) * per_mb * c.act_scale)
    assert stages[0].params == stage_params(M, 8, 8, 0, counts=[9] + [13] * 7).total
    peak = peak_memory(JOB, UNEVEN, c)
    assert peak.stage == 1 and peak.peak_bytes == max(s.peak_bytes for s in stages)
    assert peak.peak_bytes > peak_memory(JOB, EVEN, c).peak_bytes


def test_the_pipeline_is_m_slots_of_the_slowest_stage_plus_the_others_once():
    """1F1B: (m - 1) x the slowest (a 13-layer middle stage) + the sum over all 8 stages."""
    prof = load_profile("frontier")
    x, th = _Ctx(JOB, UNEVEN, prof), theta(prof.constants)
    counts = layout_stage_layers(96, UNEVEN)
    per = [stage_features(x, n, i == 0, i == 7) for i, n in enumerate(counts)]
    want = dot(th, 639 * per[1] + np.sum(per, axis=0))
    assert step_time(JOB, UNEVEN, prof).pipeline_s == pytest.approx(want, rel=1e-12)
    assert step_time(JOB, UNEVEN, prof).step_s > step_time(JOB, EVEN, prof).step_s
    assert peak_memory(JOB, UNEVEN, prof.constants).reserved_bytes < 64 * GIB


def test_the_cli_takes_the_counts(capsys):
    from megatron.cli.plan import main
    assert main(["memory", "--model", "175b", "--cluster", "frontier", "--nodes", "16",
                 "--tp", "8", "--pp", "8", "--recompute", "full", "--first-stage-layers", "9",
                 "--last-stage-layers", "9"]) == 0
    assert "busiest stage 1" in capsys.readouterr().out


def test_a_planned_uneven_layout_is_written_as_a_config_the_trainer_accepts():
    """The planner and the trainer share the rule (config/stages.py): the emitted config carries
    the counts and passes the trainer's validation; one the rule refuses is refused there too."""
    from megatron.config import Config
    from megatron.config.errors import ConfigError
    from megatron.config.validate import pipeline_stage_layers
    from megatron.planner.emit import layout_config
    job = Job(preset_model("175b"), 1280)  # 96 layers
    lay = dataclasses.replace(Layout(8, 16, 2, 1, 640), first_stage_layers=5, last_stage_layers=7)
    cfg = layout_config(Config(), job, lay)
    p = cfg.parallel
    assert (p.pipeline_first_stage_layers, p.pipeline_last_stage_layers) == (5, 7)
    assert pipeline_stage_layers(cfg) == [5] + [6] * 14 + [7] == layout_stage_layers(96, lay)
    bad = dataclasses.replace(lay, last_stage_layers=4)  # 87 over 14 stages
    with pytest.raises(ConfigError, match="pipeline_first_stage_layers"):
        layout_config(Config(), job, bad)


def test_with_model_chunks_each_rank_prices_the_sum_of_its_chunks():
    """96 layers on PP8 x 2 chunks, first 5 and last 7: chunks [5, 6 x 14, 7]. Interleaved
    1F1B's loop gives rank 0 chunks 0 and 8 (11 layers) and rank 7 chunks 7 and 15 (13); ZB-V's V
    gives rank 0 chunks 0 and 15 (12), as every other rank."""
    lay = dataclasses.replace(EVEN, interleave=2, schedule="interleaved", first_stage_layers=5,
                              last_stage_layers=7, grad_accum=640)
    assert layout_problem(JOB, lay) is None
    assert layout_stage_layers(96, lay) == [11] + [12] * 6 + [13]
    zbv = dataclasses.replace(lay, schedule="zbv")
    assert layout_problem(JOB, zbv) is None
    assert layout_stage_layers(96, zbv) == [12] * 8
    stages = memory_per_stage(JOB, lay, Constants())
    counts = [11] + [12] * 6 + [13]
    assert [s.params for s in stages] == [stage_params(M, 8, 8, i, counts=counts).total
                                          for i in range(8)]
    assert step_time(JOB, lay, load_profile("frontier")).step_s > 0


def test_ends_counted_as_a_layer_empty_the_end_chunks_and_are_priced_as_their_sums():
    """Llama 3 405B's split (Layout.embedding_as_layer, loss_as_layer; the trainer's
    parallel.pipeline_embedding_as_layer / pipeline_loss_as_layer): 126 layers + the two ends
    = 16 stages x 8 one-layer chunks, chunk 0 the embedding alone, chunk 127 the head alone.
    Rank 0 holds chunks 0, 16, ..., 112 (7 layers and the embedding), rank 15 chunks 15, ...,
    127 (7 layers and the head), the others 8; the step prices those sums as set counts of 7
    at both ends would, with 8 chunks' fill and drain."""
    llama = Job(dataclasses.replace(M, num_layers=126), 2048, "bf16")
    lay = Layout(8, 16, 64, 1, 32, interleave=8, schedule="interleaved",
                 embedding_as_layer=True, loss_as_layer=True)
    assert layout_problem(llama, lay) is None
    assert layout_stage_layers(126, lay) == [7] + [8] * 14 + [7]
    assert lay.key().endswith("-v8-interleaved-embl-lossl") and lay.uneven
    prof = load_profile("h100")
    x, th = _Ctx(llama, lay, prof), theta(prof.constants)
    per = [stage_features(x, n, i == 0, i == 15) for i, n in enumerate([7] + [8] * 14 + [7])]
    slowest = max(range(16), key=lambda i: dot(th, per[i]))
    # interleaved 1F1B over 8 chunks: (m - 1) x the slowest + the sum over the stages, the fill
    # and drain a chunk (1/8 of a stage) each
    got = step_time(llama, lay, prof)
    assert slowest in range(1, 15)  # an 8-layer middle stage
    assert got.bubble == pytest.approx(15 / (8 * 32 + 15))
    assert got.pipeline_s == pytest.approx(
        dot(th, 32 * per[slowest] + (np.sum(per, axis=0) - per[slowest]) / 8), rel=1e-12)
    # a split the rule refuses: 127 over 128 chunks; beside set counts
    assert "do not split evenly" in layout_problem(llama, dataclasses.replace(lay,
                                                                               loss_as_layer=False))
    assert "beside" in layout_problem(llama, dataclasses.replace(lay, first_stage_layers=1))


def test_counted_ends_go_from_a_config_to_the_planner_and_back():
    """A config's counted ends and chunks reach `megatron-plan memory --config` (config_layout
    read neither virtual_pipeline_size nor the set end counts before), and a planned layout is
    written with them as a config the trainer accepts."""
    from megatron.config import Config, load_config
    from megatron.config.validate import pipeline_stage_layers
    from megatron.planner.emit import layout_config
    from megatron.planner.jobs import config_layout
    from tests.support.paths import TINY
    cfg = load_config(TINY, ["parallel.pipeline_parallel_size=2", "model.num_layers=2",
                             "parallel.pipeline_schedule=interleaved",
                             "parallel.virtual_pipeline_size=2",
                             "parallel.pipeline_embedding_as_layer=true",
                             "parallel.pipeline_loss_as_layer=true"])
    got = config_layout(cfg)
    assert (got["interleave"], got["embedding_as_layer"], got["loss_as_layer"]) == (2, True, True)
    assert (got["first_stage_layers"], got["last_stage_layers"]) == (None, None)
    job = Job(preset_model("175b"), 1288)  # 96 layers + the 2 ends = 7 stages x 2 chunks x 7
    lay = Layout(8, 7, 2, 1, 644, interleave=2, schedule="interleaved", embedding_as_layer=True,
                 loss_as_layer=True)
    assert layout_problem(job, lay) is None
    out = layout_config(Config(), job, lay)
    assert (out.parallel.pipeline_embedding_as_layer, out.parallel.pipeline_loss_as_layer) == \
        (True, True)
    assert pipeline_stage_layers(out) == [6] + [7] * 12 + [6]


def test_search_offers_the_counted_ends_where_they_empty_an_end_chunk():
    """With 1 among --lighter-ends, search tries the ends counted as a layer where that leaves
    an end chunk with no layer (set counts keep one in each; end_splits covers the rest), and
    not an embedding-only stage under DeepSpeed's engine, which the trainer refuses."""
    from megatron.planner.search import SearchSpace, counted_splits, search
    assert counted_splits(126, 16, 8, (0, 1)) == [(True, True)]
    assert counted_splits(126, 16, 8, (0,)) == []
    assert counted_splits(1, 2, 1, (0, 1)) == [(False, True)]
    llama = Job(dataclasses.replace(M, num_layers=126), 2048, "bf16")
    prof = load_profile("h200")  # 141 GB: the 405B fits without recompute
    space = SearchSpace(tp=(8,), pp=(16,), micro_batch=(1,), zero=(1,), recompute=("none",),
                        sequence_parallel=(True,), interleave=(4, 8), lighter_ends=(0, 1))
    keys = [c.layout.key() for c in search(llama, 1024, prof, space).ranked]
    # first, 0.2% ahead of 4 chunks a stage with a layer fewer at each end (docs/planner.md)
    assert keys[0].endswith("-v8-interleaved-embl-lossl"), keys
    assert not any("-v8" in k and "embl" not in k for k in keys), keys  # 126 % 128: none else


def _usp_model(layers, hidden, heads, ffn, tied):
    from megatron.config import ModelConfig
    return ModelConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                       ffn_hidden_size=ffn, seq_length=4096, vocab_size=131072,
                       activation="swiglu", normalization="rmsnorm",
                       position_embedding_type="rotary", tie_embeddings=tied)


def test_nanotron_splits_its_stages_by_its_compute_cost_by_hand():
    """layout.cost_split_layers, nanotron's rule (models/base.py): a layer costs
    4 n (h/n) h + 3 f h, the output layer V h; rank r takes blocks while their running total
    is at most (r + 1)/p of the whole, the block that passes it included. The 8B shape (a
    layer 243,269,632, the output layer 536,870,912, in all 8,321,499,136): rank 0's bound
    2,080,374,784 is passed by the 9th layer (2,189,426,688), which it keeps; rank 1's
    4,160,749,568 by the 18th; rank 2's 6,241,124,352 by the 26th; the last takes 6 and
    the output layer, where an even split gives it 8 and the output layer (2.2 layers)."""
    from megatron.planner.layout import cost_split_layers
    m8 = _usp_model(32, 4096, 32, 14336, False)
    layer, head = 4 * 4096 * 4096 + 3 * 14336 * 4096, 131072 * 4096
    assert (layer, head, 32 * layer + head) == (243269632, 536870912, 8321499136)
    assert cost_split_layers(m8, 4) == (9, 9, 8, 6)
    assert cost_split_layers(m8, 2) == (18, 14)
    # 1B: the output layer costs 4 layers (20 units in all); on 8 stages the 15th layer ends
    # exactly at rank 5's bound (15/20 = 6/8), so rank 5 keeps it and passes the bound with
    # the 16th; the final norm and the output layer take the 7th, the cast and the loss the 8th
    m1 = _usp_model(16, 2048, 32, 8192, True)
    assert cost_split_layers(m1, 8) == (3, 3, 2, 3, 2, 3, 0, 0)
    assert cost_split_layers(m1, 2) == (11, 5)


def test_an_engine_that_splits_by_cost_is_searched_and_priced_with_its_split():
    """The search gives a nanotron layout its own split at every PP (any PP up to the layers,
    not only divisors), a published nanotron case gets it too, and the slowest stage is
    priced lighter than the even split's last stage (8 layers and the output layer)."""
    from megatron.planner.profile import Profile
    from megatron.planner.search import SearchSpace, search
    m8 = _usp_model(32, 4096, 32, 14336, False)
    job = Job(m8, 256, "bf16")
    prof = load_profile("h100")
    nano = Profile(dataclasses.replace(prof.spec, framework="nanotron"), prof.constants)
    found = search(job, 1, nano, SearchSpace(micro_batch=(1,), zero=(1,)))
    piped = [c.layout for c in found.ranked if c.layout.pp > 1]
    assert piped and all(lay.stage_counts == tuple(layout_stage_layers(32, lay))
                         for lay in piped)
    assert {lay.stage_counts for lay in piped if lay.pp == 4} == {(9, 9, 8, 6)}
    even = Layout(1, 4, 2, 1, 128, zero=1, recompute="none")
    split = dataclasses.replace(even, stage_counts=(9, 9, 8, 6))
    assert layout_problem(job, split, "nanotron") is None
    assert step_time(job, split, nano).pipeline_s < step_time(job, even, nano).pipeline_s
    assert "stage split 9/9/8/5 is not 4 stages holding the 32 layers" in layout_problem(
        job, dataclasses.replace(even, stage_counts=(9, 9, 8, 5)), "nanotron")


def test_an_engines_own_split_is_shown_and_never_written_as_this_trainers_config(capsys):
    """`search --framework nanotron` shows each pipelined layout's split ("2 split 21/19" for
    13B's 40 layers), and --out-config refuses it in one line naming the other engine: the
    trainer's config sets only the first/last stage counts."""
    from megatron.cli.plan import main
    code = main(["search", "--model", "gpt3-13b", "--cluster", "h100", "--nodes", "1",
                 "--global-batch", "256", "--framework", "nanotron", "--top", "3",
                 "--pp-values", "2", "--micro-batches", "1", "--out-config", "/nonexistent/x"])
    out, err = capsys.readouterr()
    assert "2 split 21/19" in out
    assert code != 0 and "the split 21/19 is another engine's (--framework nanotron)" in err
