"""Strict YAML loading with repeated `--set section.key=value` overrides."""
from __future__ import annotations

import copy
import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Optional

import yaml

from megatron.config import deepspeed_section, plugins, strict_yaml
from megatron.config.errors import ConfigError, InputError, unexpanded
from megatron.config.renames import new_key, relocate
from megatron.config.sections import SECTIONS, CheckpointConfig, DataConfig, EvalConfig, \
    KernelsConfig, ModelConfig, OptimizerConfig, ParallelConfig, ResilienceConfig, RunConfig, \
    TrainingConfig
from megatron.config.sections.checks import hints, literal_values

# The dataclass sections, then the free-form deepspeed section.
ALL_SECTIONS = (*SECTIONS, deepspeed_section.SECTION)


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    kernels: KernelsConfig = field(default_factory=KernelsConfig)
    run: RunConfig = field(default_factory=RunConfig)
    # Expert DeepSpeed keys merged into deepspeed.json: a mapping checked against an allow-list
    # (deepspeed_section.py), not a dataclass, because it mirrors DeepSpeed's own nested JSON.
    deepspeed: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.deepspeed = deepspeed_section.check_section(self.deepspeed)

    def to_dict(self) -> Dict[str, Dict[str, Any]]:
        out = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
        if self.training.train_samples is not None:  # the length is said once, in samples: the
            out["training"]["train_iters"] = None    # steps follow from the batches as loaded
        out[deepspeed_section.SECTION] = copy.deepcopy(self.deepspeed)
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Dict[str, Any]]) -> "Config":
        """The inverse of to_dict (a section or the deepspeed mapping may be absent: defaults);
        values are taken as typed, not parsed as YAML text is. A config.yaml written before a
        key moved (config/renames.py) loads with the key in its new section."""
        d = relocate(d, " (a saved config)")
        _known_keys(d)
        _import_plugins(d)
        return cls(**{name: section(**d.get(name, {})) for name, section in SECTIONS.items()},
                   deepspeed=copy.deepcopy(d.get(deepspeed_section.SECTION, {})))


def _known_keys(d: Dict[str, Any]) -> None:
    """A saved config (a run's config.yaml, a single-file model's) holds only sections and keys
    this version knows, sub-sections (model.moe) included: one written by a newer version, or
    edited by hand, is refused naming the key, not read with it dropped or failing inside a
    constructor."""
    later = "a config written by a newer version of this framework may hold keys it does not know"
    fix = "read it with the version that wrote it, or remove the"
    for name, values in d.items():
        if name not in ALL_SECTIONS:
            raise ConfigError(f"{name} (a saved config)", "...", f"a section among "
                              f"{', '.join(ALL_SECTIONS)}; {later}", f"{fix} section")
        _known_fields(name, values, SECTIONS.get(name), later, fix)


def _known_fields(path: str, values: Any, cls, later: str, fix: str) -> None:
    if cls is None:  # the deepspeed section: its own allow-list, checked when it is merged
        return
    if not isinstance(values, dict):
        raise ConfigError(f"{path} (a saved config)", values, "a mapping of its keys",
                          "write the section as a mapping")
    types = _field_types(cls)
    for key, value in values.items():
        if key not in types:
            raise ConfigError(f"{path}.{key} (a saved config)", value, f"a known key of "
                              f"section '{path}' ({', '.join(sorted(types))}); {later}",
                              f"{fix} key")
        if dataclasses.is_dataclass(types[key]) and isinstance(value, dict):
            _known_fields(f"{path}.{key}", value, types[key], later, fix)


def _coerce(field_name: str, text: str, annotation) -> Any:
    """Turn an override string into the field's type; YAML syntax is accepted for lists."""
    origin = typing.get_origin(annotation)
    optional = origin is typing.Union and type(None) in typing.get_args(annotation)
    base = [a for a in typing.get_args(annotation) if a is not type(None)][0] if optional \
        else annotation
    if text.lower() in ("none", "null", "~"):
        if optional:
            return None
        # For strings, "none" may be a legal choice (training.activation_checkpointing=none).
        if not _is_str(base) or text.lower() != "none":
            raise ConfigError(field_name, text, f"a value of type {_type_name(base)} (it cannot "
                              "be null)")
    if _is_str(base):
        # Taken verbatim: YAML would turn run.dir=2024.10 into 2024.1 and on/off into booleans.
        return text
    try:
        value = yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        raise ConfigError(field_name, text, f"a value of type {_type_name(base)} in YAML syntax "
                          "(lists as [a, b])") from None
    return _check_type(field_name, value, base)


def _is_str(annotation) -> bool:
    """A string field: str, or a Literal of strings (its choices are checked by the section)."""
    values = literal_values(annotation)
    return annotation is str or (values is not None and all(isinstance(v, str) for v in values))


def _type_name(annotation) -> str:
    if _is_str(annotation):
        return "str"
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


_FLOAT_LITERAL = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _check_type(field_name: str, value, base):
    if typing.get_origin(base) in (list, typing.List):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise ConfigError(field_name, value, "a list")
        item = (typing.get_args(base) or (str,))[0]
        if item is str:
            return [str(v) for v in value]
        if item is int and any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise ConfigError(field_name, value, "a list of integers (YAML: [a, b, c])")
        return list(value)
    if base is bool:
        if not isinstance(value, bool):
            raise ConfigError(field_name, value, "true or false")
        return value
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(field_name, value, "an integer")
        return value
    if base is float:
        if isinstance(value, str) and _FLOAT_LITERAL.fullmatch(value.strip()):
            # YAML 1.1 (PyYAML) reads 6e-5 as a string: its floats need a dot (6.0e-5).
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(field_name, value, "a number")
        return float(value)
    if _is_str(base):
        return str(value)
    return value


def _field_types(section_cls) -> Dict[str, Any]:
    return {f.name: hints(section_cls)[f.name] for f in dataclasses.fields(section_cls)}


def _build_section(name: str, values: Dict[str, Any], cls=None):
    """The section class `cls` (SECTIONS[name] when None) from a mapping of its keys: unknown
    keys, nulls and types checked per key, a sub-section's mapping (model.moe) built the same."""
    cls = cls or SECTIONS[name]
    types = _field_types(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in types:
            raise ConfigError(f"{name}.{key}", value, f"a known key of section '{name}' "
                              f"({', '.join(sorted(types))})", "remove it or fix its spelling")
        annotation = types[key]
        if dataclasses.is_dataclass(annotation):
            if not isinstance(value, dict):
                raise ConfigError(f"{name}.{key}", value, f"a mapping of the keys of section "
                                  f"'{name}.{key}'", "write it as a nested mapping")
            kwargs[key] = _build_section(f"{name}.{key}", value, annotation)
            continue
        if value is None:
            if type(None) not in typing.get_args(annotation):
                raise ConfigError(f"{name}.{key}", value, f"a value of type "
                                  f"{_type_name(annotation)} (it cannot be null or empty)")
            kwargs[key] = None
            continue
        base = [a for a in typing.get_args(annotation) if a is not type(None)]
        kwargs[key] = _check_type(f"{name}.{key}", value,
                                  base[0] if typing.get_origin(annotation) is typing.Union else annotation)
    return cls(**kwargs)


def _override_target(section: str, name: str, text: str, out: Dict[str, Dict[str, Any]]):
    """(the mapping a --set writes into, the key, its type) for section.name, name dotted into
    a sub-section (model.moe.top_k)."""
    cls, target, where = SECTIONS[section], out.setdefault(section, {}), section
    while "." in name:
        sub, name = name.split(".", 1)
        annotation = _field_types(cls).get(sub)
        if not dataclasses.is_dataclass(annotation):
            raise ConfigError(f"{where}.{sub}.{name}", text, f"a key of section '{where}', or of "
                              f"one of its sub-sections", "fix its spelling")
        cls, where = annotation, f"{where}.{sub}"
        target = target.setdefault(sub, {})
    types = _field_types(cls)
    if dataclasses.is_dataclass(types.get(name)):
        raise ConfigError(f"{where}.{name}", text, f"a key of the sub-section '{where}.{name}' "
                          f"({', '.join(sorted(_field_types(types[name])))})",
                          f"set one key at a time, e.g. {where}.{name}.<key>=<value>")
    if name not in types:
        raise ConfigError(f"{where}.{name}", text, f"a known key of section '{where}' "
                          f"({', '.join(sorted(types))})", "fix its spelling")
    return target, name, types[name]


def _import_plugins(sections: Dict[str, Any]) -> None:
    """run.plugins imported before any section is built: model.normalization and the other
    registry fields may name what they register (config/plugins.py)."""
    run = sections.get("run")
    if isinstance(run, dict) and "plugins" in run:
        plugins.import_listed(run["plugins"])


def _merge(into: Dict[str, Any], values: Dict[str, Any]) -> None:
    """values into `into`, a sub-section's mapping merged key by key (a YAML file's model.moe
    and a --set of model.moe.top_k both hold)."""
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def parse_overrides(overrides: Iterable[str]) -> Dict[str, Dict[str, Any]]:
    """['model.hidden_size=128', ...] -> {'model': {'hidden_size': 128}} with typed values.
    The deepspeed section takes dotted paths: deepspeed.zero_optimization.overlap_comm=true."""
    out: Dict[str, Dict[str, Any]] = {}
    for item in overrides:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError("--set", item, "section.key=value, for example model.hidden_size=128")
        key, text = item.split("=", 1)
        section, name = new_key(*key.strip().split(".", 1), where=" (--set)")
        key = f"{section}.{name}"
        if section == deepspeed_section.SECTION:
            out[section] = deepspeed_section.merge(
                out.get(section, {}), deepspeed_section.parse_override(name, text),
                unset=False)
            continue
        if section not in SECTIONS:
            raise ConfigError(key, text, f"a section among {', '.join(ALL_SECTIONS)}")
        target, leaf, annotation = _override_target(section, name, text, out)
        target[leaf] = _coerce(key, text.strip(), annotation)
    return out


def _read_yaml(path: str) -> Dict[str, Any]:
    try:
        raw = strict_yaml.load_file(path, "config file") or {}
    except FileNotFoundError:
        raise InputError(f"config file {path!r} does not exist{unexpanded(path)}; pass an "
                         f"existing YAML file to "
                         f"--config (see examples/local/tiny.yaml)") from None
    except yaml.YAMLError as e:
        raise InputError(f"config file {path!r} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise InputError(f"config file {path!r} must hold a mapping of sections "
                         f"({', '.join(ALL_SECTIONS)}), found {type(raw).__name__}")
    for section, values in raw.items():
        if section not in ALL_SECTIONS:
            raise ConfigError(str(section), "...", f"a section among {', '.join(ALL_SECTIONS)}",
                              f"remove or rename it in {path}")
        if not isinstance(values, dict):
            raise ConfigError(str(section), values, "a mapping of keys to values", f"fix {path}")
    return raw


def load_config(path: Optional[str] = None, overrides: Iterable[str] = ()) -> Config:
    """YAML file (optional) then overrides; every section is validated on construction."""
    merged: Dict[str, Dict[str, Any]] = {name: {} for name in ALL_SECTIONS}
    if path:
        for section, values in relocate(_read_yaml(path), f" (in {path})").items():
            _merge(merged[section], values)
    ds = deepspeed_section.SECTION
    for section, values in parse_overrides(overrides).items():
        if section == ds:
            merged[ds] = deepspeed_section.merge(merged[ds], values)
        else:
            _merge(merged[section], values)
    return build_config(merged)


def build_config(sections: Dict[str, Dict[str, Any]]) -> Config:
    """A Config from typed values per section (absent sections and keys take their defaults),
    checked as a YAML file is: unknown keys, types, nulls and each section's own rules."""
    for section in sections:
        if section not in ALL_SECTIONS:
            raise ConfigError(str(section), "...", f"a section among {', '.join(ALL_SECTIONS)}")
    sections = relocate(sections)
    _import_plugins(sections)
    return Config(**{name: _build_section(name, sections.get(name, {})) for name in SECTIONS},
                  deepspeed=dict(sections.get(deepspeed_section.SECTION, {})))
