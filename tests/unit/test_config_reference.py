"""The config documents itself (config/reference.py): docs/config.md is what the sections
generate, byte for byte; every field has a docstring; every string field with a fixed set of
values is a Literal, or names the registry its values come from; no section outgrows its owner.
A failure names the field and what it needs."""
import dataclasses
import os
import typing

import pytest

from megatron.cli.train import main
from megatron.config import reference, schedules, variants
from megatron.config.sections import SECTIONS, SUBSECTIONS
from megatron.config.sections.checks import CHOICES, SOURCE, hints, literal_values
from tests.support.paths import ROOT

DOC = os.path.join(ROOT, "docs", "config.md")
MAX_FIELDS = 20
# String fields whose value is a name or a path, not one of a fixed set.
FREE_TEXT = {"run.dir", "run.wandb_project", "run.wandb_name", "run.wandb_entity", "data.split",
             "data.tokenizer_model", "data.vocab_file", "data.merges_file", "data.cache_dir",
             "checkpoint.load", "checkpoint.save_local_dir", "checkpoint.init_from"}


def _fields():
    for section, cls in {**SECTIONS, **SUBSECTIONS}.items():
        for f in dataclasses.fields(cls):
            yield section, cls, f


def test_docs_config_md_is_what_the_sections_generate():
    with open(DOC) as f:
        written = f.read()
    assert written == reference.markdown(), ("docs/config.md is stale: run "
                                             "`python tools/config_reference.py` and commit it")


def test_every_field_has_a_docstring():
    missing = [f"{s}.{f.name}" for s, cls, f in _fields()
               if not reference.field_docs(cls).get(f.name)]
    assert not missing, ("fields without documentation: write a string literal on the line "
                         "right after each field (what it does, its unit, what its default or "
                         "null means): " + ", ".join(missing))


def test_string_choices_are_literals_or_name_their_registry():
    loose = []
    for section, cls, f in _fields():
        plain = hints(cls)[f.name] in (str, typing.Optional[str])
        if not plain or f"{section}.{f.name}" in FREE_TEXT:
            continue
        if CHOICES not in f.metadata or not f.metadata.get(SOURCE):
            loose.append(f"{section}.{f.name}")
    assert not loose, ("string fields typed plain str: type each Literal[...] of its values, or "
                       "give it metadata=checks.registry(names, source) when a registry holds "
                       "them, or add it to FREE_TEXT here if it is a name or path: "
                       + ", ".join(loose))


def test_no_section_has_more_fields_than_one_owner_reads():
    """Each section's own values, a sub-section (model.moe) counted as a section of its own: the
    model is one architecture that model_math and the planner read whole, its experts a part."""
    sizes = {s: sum(not dataclasses.is_dataclass(hints(cls)[f.name])
                    for f in dataclasses.fields(cls))
             for s, cls in {**SECTIONS, **SUBSECTIONS}.items()}
    over = {s: n for s, n in sizes.items() if n > MAX_FIELDS}
    assert not over, (f"sections over {MAX_FIELDS} fields: {over}; split them by the component "
                      "that reads them (config/sections/)")
    assert sizes["model"] == 20 and sizes["model.moe"] == 10
    subsections = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)
                   if dataclasses.is_dataclass(hints(cls)[f.name])}
    assert subsections == set(SUBSECTIONS)


def test_registry_fields_list_the_registry_and_check_against_it():
    rows = {(r.section, r.name): r for s in SECTIONS for r in reference.rows(s)}
    assert rows["parallel", "pipeline_schedule"].choices.startswith(
        " | ".join(schedules.names()))
    for kind, name in variants.KIND_FIELD.items():
        assert rows["model", name].choices.startswith(" | ".join(variants.choices(kind)))
    assert rows["training", "precision"].choices == "fp32 | bf16 | fp16"
    assert literal_values(hints(SECTIONS["training"])["precision"]) == ("fp32", "bf16", "fp16")


def test_the_names_design_md_promises_stay_in_the_training_section():
    for name in ("micro_batch_size", "global_batch_size", "train_iters", "precision"):
        assert name in SECTIONS["training"].__dataclass_fields__


def test_help_config_prints_a_sub_section(capsys):
    assert main(["--help-config", "model.moe"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("model.moe:") and "model.moe.top_k (int, default 2)" in out
    assert "model.num_layers" not in out


@pytest.mark.parametrize("section", [None, "checkpoint"])
def test_help_config_prints_the_reference(section, capsys):
    argv = ["--help-config"] + ([section] if section else [])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out == reference.text(section)
    assert "checkpoint.save_interval (int, default 0)" in out
    assert ("model.num_layers" in out) == (section is None)
