"""Every config under examples/local loads and passes the cross-section checks at one rank
(the demos with the data files demo.sh fills in), so an example cannot rot unnoticed; the MoE
demo is a MoE model that uses the router bias and a shared expert, the Gemma 2 demo has its
windows and caps. A failure names the file."""
import glob
import os

import pytest
import yaml

from megatron.config import load_config, validate_for_world
from tests.support.paths import ROOT

EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "examples", "local", "*.yaml")))
DATA = ["data.tokenizer_model=/nonexistent/tokenizer.model", "data.paths=[/nonexistent/corpus]"]


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_example_loads_and_validates(path):
    with open(path) as f:
        synthetic = (yaml.safe_load(f).get("data") or {}).get("synthetic", False)
    cfg = load_config(path, [] if synthetic else DATA)
    assert validate_for_world(cfg, 1) == 1


def test_the_moe_demo_is_a_moe_model_with_the_new_features():
    assert os.path.join(ROOT, "examples", "local", "moe-tiny.yaml") in EXAMPLES
    m = load_config(os.path.join(ROOT, "examples", "local", "moe-tiny.yaml"), DATA).model
    assert m.moe.num_experts == 8 and m.moe.router_bias_update_rate > 0
    assert m.moe.shared_expert_ffn_hidden_size and m.moe.aux_loss_coeff == 0


def test_the_gemma2_demo_has_gemma_2s_windows_and_caps():
    path = os.path.join(ROOT, "examples", "local", "gemma2-tiny.yaml")
    assert path in EXAMPLES
    m = load_config(path, DATA).model
    assert (m.attention.sliding_window, m.attention.sliding_window_pattern) == (32, 2)
    assert (m.attention.logit_softcapping, m.output.logit_softcapping) == (50.0, 30.0)
    assert m.activation == "geglu" and m.residual.post_norms and m.num_query_groups == 2
