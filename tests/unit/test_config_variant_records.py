"""The model-variant registry's promise (config/variants.py): a norm, MLP, position scheme or
attention core is named in one place, its record, and everything else reads the records. The
Hugging Face architectures' variants come from the records' `hf` names, and no module outside
the records branches on a variant's name."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from megatron.checkpoint.hf_import import model_section
from megatron.config import variants
from megatron.planner.models import preset_model
from tests.support.paths import ROOT

# Where variant names may stand in code: the built-in records, and the fused-kernel package,
# whose ops (rotary, swiglu, ...) are a registry of their own that happens to share names.
RECORD_PLACES = ("megatron/config/builtin_variants.py", "megatron/kernels/")


def test_an_architecture_s_variants_are_the_records_that_hold_its_names():
    assert variants.of_architecture("gpt2") == {
        "normalization": "layernorm", "activation": "gelu", "position_embedding_type": "learned"}
    assert variants.of_architecture("llama") == {
        "normalization": "rmsnorm", "activation": "swiglu", "position_embedding_type": "rotary"}
    # what the converter and the planner's presets now take from it
    gpt2 = model_section({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
                          "n_positions": 32, "vocab_size": 100})
    llama = model_section({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "intermediate_size": 96,
                           "max_position_embeddings": 32, "vocab_size": 100})
    assert (gpt2["normalization"], llama["activation"]) == ("layernorm", "swiglu")
    m = preset_model("22b")
    assert (m.normalization, m.activation, m.position_embedding_type) == (
        "layernorm", "gelu", "learned")


def test_an_architecture_held_by_two_variants_of_a_kind_is_refused_by_name():
    extra = variants.Variant("norm", "scalenorm", "megatron.model.norm:RMSNorm",
                             hf={"llama": {"weight": "weight"}})
    variants.register(extra)
    try:
        with pytest.raises(ValueError, match=r"'llama': 2 norm variants hold it "
                                             r"\(rmsnorm, scalenorm\)"):
            variants.of_architecture("llama")
        with pytest.raises(ValueError, match=r"'opt': 0 norm variants"):
            variants.of_architecture("opt")
    finally:
        variants.unregister("norm", "scalenorm")
    assert variants.of_architecture("llama")["normalization"] == "rmsnorm"


def _branch_on_a_name() -> "re.Pattern":
    """`x == "rmsnorm"`, `x in ("gelu", ...)`, a list or call that names one (`("swiglu",`,
    `, "gelu")`), a table keyed by one (`{"rotary": ...}`), or a keyword set to one
    (`activation="gelu"`, `"normalization": "layernorm"`), for every registered variant name.
    Not argparse's `dest` nor a boolean keyed by a name (the layout's `"flash": True`), which
    name no variant."""
    names = "|".join(re.escape(n) for kind in variants.KIND_FIELD for n in variants.names(kind))
    name = rf"""["']({names})["']"""
    return re.compile(rf"""[=!]=\s*{name}|{name}\s*[=!]=|\bin\s*[(\[{{]\s*{name}"""
                      rf"""|[(\[{{]\s*{name}\s*,|,\s*{name}\s*\)"""
                      rf"""|{name}\s*:\s(?!\s*(True|False|not\b))"""
                      rf"""|\b(?!dest\b)\w+\s*=\s*{name}|:\s*{name}""")


def test_the_rule_catches_what_it_guards_against():
    branch = _branch_on_a_name()
    for line in ('if m.activation == "swiglu":', 'normalization="rmsnorm", activation=x',
                 '"position_embedding_type": "rotary",', 'if kind in ("gelu", "swiglu"):',
                 'FC1 = {"swiglu": 2}', 'v.get("norm", "layernorm")'):
        assert branch.search(line), line
    assert not branch.search('hf={"llama": {}}')
    assert not branch.search('g.add_argument("--flash", dest="flash", action="store_const",')
    assert not branch.search('{"flash": True, "sp": False}')
    assert branch.search('backend = "flash" if fast else "math"')


def test_only_the_records_name_a_variant_in_code():
    """Outside the records (and config/sections/model.py's field defaults, which say what an
    unset field means), code reads a variant through the registry: variants.of(m, kind)'s
    facts, or of_architecture for a converter's architecture."""
    branch, root = _branch_on_a_name(), Path(ROOT)
    allowed = RECORD_PLACES + ("megatron/config/sections/model.py",)
    found = [f"{rel}:{i}: {line.strip()}"
             for path in sorted((root / "megatron").rglob("*.py"))
             for rel in [path.relative_to(root).as_posix()]
             if not rel.startswith(allowed)
             for i, line in enumerate(path.read_text().splitlines(), 1)
             if branch.search(line.split("#", 1)[0])]  # comments may name them
    assert not found, "variant names outside their records:\n" + "\n".join(found)
