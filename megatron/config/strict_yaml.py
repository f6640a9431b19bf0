"""YAML loading that refuses a key written twice in one mapping (PyYAML keeps the last one
silently, so a repeated `lr:` would drop the first value without a word)."""
from __future__ import annotations

from typing import Any

import yaml


class _StrictLoader(yaml.SafeLoader):
    pass


def _mapping_without_repeats(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    first_line = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in first_line:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark,
                f"key {key!r} appears twice (lines {first_line[key]} and {line}); keep one",
                key_node.start_mark)
        first_line[key] = line
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                              _mapping_without_repeats)


def safe_load(stream) -> Any:
    """yaml.safe_load, but a repeated key raises yaml.YAMLError naming the key and both lines."""
    return yaml.load(stream, Loader=_StrictLoader)
