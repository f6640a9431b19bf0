"""The config reference, generated from the section dataclasses: per field its section, name,
type, default, choices and documentation (the string literal right after the field: the
attribute-docstring convention, read here with `ast`, as torchtitan documents its job config).
docs/config.md is markdown() written out (tools/config_reference.py; a unit test regenerates it
and compares), and `megatron-train --help-config [SECTION]` prints text() in the terminal.

Choices of a field typed Literal[...] are its arguments; a field whose names come from a
registry (checks.registry metadata) lists the names registered when the reference is made."""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass
from typing import Dict, List, Optional

from megatron.config import environ
from megatron.config.errors import ConfigError
from megatron.config.sections import MOVED, SECTIONS, SUBSECTIONS
from megatron.config.sections.checks import CHOICES, SOURCE, hints, literal_values


@dataclass(frozen=True)
class Row:
    section: str
    name: str
    type: str
    default: str
    choices: str  # "" when any value of the type is accepted
    doc: str  # "" when the field has no docstring (a unit test refuses that)


@functools.lru_cache(maxsize=None)
def field_docs(cls) -> Dict[str, str]:
    """Field name -> its docstring (whitespace collapsed to one line) for a section class."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def type_name(annotation) -> str:
    """int, float, bool, str, list of str; "or null" where the field is Optional."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)][0]
        return f"{type_name(inner)} or null"
    if literal_values(annotation) is not None:
        return "str"
    if typing.get_origin(annotation) in (list, typing.List):
        return f"list of {type_name(args[0])}"
    return getattr(annotation, "__name__", str(annotation))


def yaml_value(value) -> str:
    """A default as it is written in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def _default(f: dataclasses.Field):
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _choices(f: dataclasses.Field, annotation) -> str:
    values = literal_values(annotation)
    if values is not None:
        return " | ".join(map(str, values))
    if CHOICES in f.metadata:
        return " | ".join(f.metadata[CHOICES]()) + f" (registry: {f.metadata[SOURCE]})"
    return ""


def documented() -> Dict[str, type]:
    """Every section and sub-section in the order the reference lists them: each sub-section
    (model.moe) right after its section."""
    out = {}
    for name, cls in SECTIONS.items():
        out[name] = cls
        out.update({sub: c for sub, c in SUBSECTIONS.items() if sub.startswith(name + ".")})
    return out


def rows(section: str) -> List[Row]:
    cls = documented()[section]
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        annotation = hints(cls)[f.name]
        if dataclasses.is_dataclass(annotation):  # a sub-section: listed on its own
            out.append(Row(section, f.name, "section", f"see {section}.{f.name}", "",
                           docs.get(f.name, "")))
            continue
        out.append(Row(section, f.name, type_name(annotation), yaml_value(_default(f)),
                       _choices(f, annotation), docs.get(f.name, "")))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


HEADER = """# Config reference

Generated from the section dataclasses in `megatron/config/sections/` by
`python tools/config_reference.py` (a unit test checks that this file matches them); the same
text is in the terminal with `megatron-train --help-config [SECTION]`. A config is a YAML file
of these sections (`--config FILE.yaml`) plus repeated `--set section.key=value` overrides;
unknown keys are errors. A sub-section (`model.moe`) is a nested mapping in YAML
(`model: {moe: {num_experts: 8}}`) and a dotted key in `--set` (`model.moe.num_experts=8`).
The `deepspeed:` section (expert DeepSpeed keys merged into deepspeed.json) is checked against
its own allow-list: `megatron/config/deepspeed_section.py`.

Choices marked "registry" come from a registry of records (model variants, pipeline schedules):
listed here are the names registered when this file was generated; a plugin (`--plugin MODULE`
or `MEGATRON_PLUGINS`) may register more at run time, and the config accepts those too.
"""


def _section_md(section: str) -> List[str]:
    out = [f"## {section}", "", "| Field | Type | Default | Choices | Description |",
           "|---|---|---|---|---|"]
    for r in rows(section):
        out.append(f"| `{r.name}` | {r.type} | `{_cell(r.default)}` | {_cell(r.choices)} | "
                   f"{_cell(r.doc)} |")
    return out + [""]


def _moved_md() -> List[str]:
    out = ["## Moved keys", "", "Keys of older versions still load (YAML, `--set`, a run "
           "directory's config.yaml), each with one warning naming its new place.", "",
           "| Old key | New key |", "|---|---|"]
    out += [f"| `{a}.{b}` | `{c}.{d}` |" for (a, b), (c, d) in MOVED.items()]
    return out + [""]


def _environ_md() -> List[str]:
    out = ["## Environment variables", "", "The `MEGATRON_*` variables read "
           "(`config/environ.py`); megatron-train and the job chain name any other "
           "`MEGATRON_*` variable of the job's environment in one warning, a misspelling being "
           "the usual cause.", "",
           "| Variable | What it does |", "|---|---|"]
    out += [f"| `{name}` | {_cell(what)} |" for name, what in environ.KNOWN.items()]
    return out + [""]


def markdown() -> str:
    """docs/config.md."""
    lines = [HEADER]
    for section in documented():
        lines += _section_md(section)
    return "\n".join(lines + _moved_md() + _environ_md())


def text(section: Optional[str] = None, width: int = 96) -> str:
    """The reference as terminal text: every section, or one."""
    sections = documented()
    if section is not None and section not in sections:
        raise ConfigError("--help-config", section, f"a section among {', '.join(sections)}",
                          "e.g. --help-config checkpoint, or no section for all of them")
    out = []
    for name in [section] if section else list(sections):
        out.append(f"{name}:")
        for r in rows(name):
            facts = f"{r.type}, default {r.default}" + (f"; one of {r.choices}" if r.choices
                                                         else "")
            out.append(f"  {r.section}.{r.name} ({facts})")
            out += textwrap.wrap(r.doc, width, initial_indent=" " * 6,
                                 subsequent_indent=" " * 6)
        out.append("")
    return "\n".join(out)
