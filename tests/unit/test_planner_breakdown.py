"""planner/breakdown.py: the predicted step read back as named terms (megatron-plan memory's
"where the step goes", search's note on why the config's layout is behind the best)."""
import dataclasses

import pytest

from megatron.planner import breakdown
from megatron.planner.hardware import PRESETS
from megatron.planner.layout import Job, Layout
from megatron.planner.models import preset_model
from megatron.planner.profile import Constants, Profile, load_profile
from megatron.planner.timing import step_time

# (name, job, layout, cluster): one of each way a pipeline time is composed
_175B = Job(preset_model("175b"), 1280)
LAYOUTS = [
    ("one stage", _175B, Layout(8, 16, 1, 1, 1280, zero=1, recompute="full"), "frontier"),
    ("1f1b", _175B, Layout(4, 16, 2, 1, 640, zero=1, recompute="full"), "frontier"),
    ("interleaved", _175B, Layout(4, 16, 2, 1, 640, zero=1, recompute="full", interleave=2),
     "frontier"),
    ("zbh1", _175B, Layout(4, 16, 2, 1, 640, zero=1, recompute="full", schedule="zbh1"),
     "frontier"),
    ("zbv", _175B, Layout(4, 16, 2, 1, 640, zero=1, recompute="full", schedule="zbv"),
     "frontier"),
    ("cp ring", Job(preset_model("gpt3-6.7b"), 64), Layout(2, 2, 4, 1, 16, zero=1, cp=2,
                                                             cp_algo="ring", flash=True), "a100"),
]


@pytest.mark.parametrize("name,job,lay,cluster", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_the_terms_add_up_to_the_predicted_step(name, job, lay, cluster):
    prof = load_profile(cluster)
    b = breakdown.step_breakdown(job, lay, prof)
    assert list(b.seconds) == list(breakdown.TERMS)
    assert b.step_s == pytest.approx(step_time(job, lay, prof).step_s, rel=1e-12)
    assert sum(b.seconds.values()) == pytest.approx(b.step_s, rel=1e-9)
    assert all(v >= -1e-9 * b.step_s for v in b.seconds.values()), b.seconds
    if lay.pp == 1:
        assert b.seconds[breakdown.FILL] == 0


def test_tp_collectives_in_a_node_by_hand():
    """Megatron-LM as Narayanan et al. ran it hides no TP collective: without recompute a layer
    runs four all-reduces of s b h activation bytes a micro-batch (two forward, two backward),
    each 2 (t - 1)/t of them over the TP group's link plus its latency, and one stage holding
    the whole model adds two more (the vocabulary-parallel embedding's output, the output
    layer's input gradient); at TP 1 there are none."""
    job = Job(preset_model("gpt3-1.3b"), 64, "bf16")
    spec = dataclasses.replace(PRESETS["a100"], framework="megatron-lm-2021")
    c = Constants()
    prof = Profile(spec, c)
    t, m = 4, 8
    lay = Layout(t, 1, 2, 1, m, recompute="none")
    b = breakdown.step_breakdown(job, lay, prof)
    model = job.model
    link = spec.link(t, 1)
    nbytes = model.seq_length * 1 * model.hidden_size * 2
    per_call = 2 * (t - 1) / t * nbytes / link.bus_bytes_per_s / c.comm_eff \
        + link.alpha_s * c.latency_scale
    assert b.seconds["collectives in a node"] == pytest.approx(
        m * (model.num_layers * 4 + 2) * per_call, rel=1e-9)
    assert b.seconds["collectives across nodes"] == 0
    one = breakdown.step_breakdown(job, Layout(1, 1, 8, 1, 8, recompute="none"), prof)
    assert one.seconds["collectives in a node"] == 0


def test_the_gap_names_what_sets_two_layouts_apart():
    """Full recompute replays the layers' forward: against the same layout without it, compute
    is what differs most, by a third of the recompute-free run's compute (three passes become
    four) less the output layer's share, which is not replayed (for the 1.3B GPT about 9%:
    vocabulary 51200 against 24 layers of 12 h^2 at h 2048), and the explanation names it first
    with that sign."""
    prof = load_profile("a100")
    job = Job(preset_model("gpt3-1.3b"), 64, "bf16")
    full = breakdown.step_breakdown(job, Layout(1, 1, 8, 1, 8, recompute="full"), prof)
    none = breakdown.step_breakdown(job, Layout(1, 1, 8, 1, 8, recompute="none"), prof)
    term, gap = breakdown.differences(full, none)[0]
    assert term == "compute" and gap > 0
    assert 0.85 * none.seconds["compute"] / 3 < gap < none.seconds["compute"] / 3
    assert breakdown.explain_gap(full, none, 1) == f"{gap:+.3g} s compute"
