"""The field checks every section's __post_init__ shares, and the one rule for a string field's
choices: a `Literal[...]` type is its fixed set; a field whose names come from a registry that
plugins extend at run time stays `str` and names the registry in its metadata (`registry()`),
because a Literal is fixed when the class is defined, before any plugin registers a name."""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any, Callable, Dict, Optional, Tuple

from megatron.config.errors import ConfigError, as_shell_would, shell_syntax
from megatron.config.plugins import registry_fix

# A field's metadata keys: where its choices come from at run time, and the words naming it
CHOICES, SOURCE = "choices", "choices_source"


def registry(choices: Callable[[], Tuple[str, ...]], source: str) -> Dict[str, Any]:
    """Field metadata for a string chosen from a registry: `choices()` is asked at each check
    (so a plugin's names count), `source` says where a reader finds the registry."""
    return {CHOICES: choices, SOURCE: source}


def choice(section: str, name: str, value, allowed, fix: str = "") -> None:
    if value not in allowed:
        raise ConfigError(f"{section}.{name}", value, f"one of {', '.join(map(str, allowed))}",
                          fix)


def written_out(section: str, name: str, value) -> None:
    """A path field names its path in full. A config is not a shell: `$MEMBERWORK/runs` or
    `~/runs` would name a folder called '$MEMBERWORK' or '~', and a run's checkpoints would go
    there without a word. For a list (data.paths' "WEIGHT PREFIX" items) each word of each item
    is checked."""
    listed = isinstance(value, list)
    words = [w for item in value for w in str(item).split()] if listed else \
        [value] if isinstance(value, str) else []
    for word in words:
        token = shell_syntax(word)
        if token is None:
            continue
        field, expanded = f"{section}.{name}", as_shell_would(word)
        fix = "write the path in full"
        if expanded is not None:
            fix += f" (here {word} is {expanded})"
        home = word == "~" or word.startswith("~/")
        if not listed and (home or not word.startswith("~")):
            # the shell expands $NAME in double quotes, and ~ there only as $HOME
            shell = "$HOME" + word[1:] if home else word
            fix += f", or let the shell expand it: --set {field}=\"{shell}\""
        raise ConfigError(field, value, f"a path written out: a config does not expand "
                          f"{token!r} as a shell does, and would take it as a folder's name",
                          fix)


def positive(section: str, name: str, value, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        raise ConfigError(f"{section}.{name}", value,
                          "a non-negative number" if allow_zero else "a positive number")


def at_most(section: str, name: str, value, most) -> None:
    if value > most:
        raise ConfigError(f"{section}.{name}", value, f"at most {most:,} (beyond any model this "
                          "framework can build or price)")


def finite(section: str, obj) -> None:
    """Every float field of a section is finite. YAML reads .inf and .nan (and 1e999 overflows
    to inf); each later range check would compare false or true without a word."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{section}.{f.name}", value, "a finite number (not NaN or "
                              "infinity)")


def fraction(section: str, name: str, value) -> None:
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"{section}.{name}", value, "a probability in [0, 1)")


def literal_values(annotation) -> Optional[Tuple[Any, ...]]:
    """The values of a Literal type (also inside Optional[...]); None for any other type."""
    if typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = args[0] if len(args) == 1 else annotation
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return None


@functools.lru_cache(maxsize=None)
def hints(cls) -> Dict[str, Any]:
    """A section's resolved field types (the sections use postponed annotations)."""
    return typing.get_type_hints(cls)


@functools.lru_cache(maxsize=None)
def registry_fields(cls) -> frozenset:
    """The fields whose choices come from a registry that plugins extend."""
    return frozenset(f.name for f in dataclasses.fields(cls) if CHOICES in f.metadata)


@functools.lru_cache(maxsize=None)
def field_choices(cls) -> Dict[str, Callable[[], Tuple[Any, ...]]]:
    """Field name -> a function giving its allowed values, for every field with fixed choices
    (its Literal) or registry choices (its metadata)."""
    out = {}
    for f in dataclasses.fields(cls):
        values = literal_values(hints(cls)[f.name])
        if values is not None:
            out[f.name] = functools.partial(tuple, values)
        elif CHOICES in f.metadata:
            out[f.name] = f.metadata[CHOICES]
    return out


def check_choices(section: str, obj) -> None:
    """Each field with choices holds one of them (or None, where its type is Optional)."""
    types = hints(type(obj))
    for name, allowed in field_choices(type(obj)).items():
        value = getattr(obj, name)
        if value is None and type(None) in typing.get_args(types[name]):
            continue
        fix = registry_fix(f"{section}.{name}") if name in registry_fields(type(obj)) else ""
        choice(section, name, value, allowed(), fix)
