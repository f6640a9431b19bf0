"""YAML loading that refuses a key written twice in one mapping (PyYAML keeps the last one
silently, so a repeated `lr:` would drop the first value without a word), read as UTF-8 text
whatever the locale, with one InputError naming the file where it is not."""
from __future__ import annotations

import errno
from typing import Any

import yaml

from megatron.config.errors import InputError


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
    """yaml.safe_load, but a repeated key raises yaml.YAMLError naming the key and both lines,
    and a file that is not UTF-8 text (or cannot be read) raises InputError naming it."""
    return yaml.load(_text(stream), Loader=_StrictLoader)


def load_file(path: str, what: str = "the YAML file") -> Any:
    """safe_load of the file at `path`. A missing file raises FileNotFoundError, which each
    caller words for its flag; any other file that cannot be opened raises InputError naming
    it as `what` (the flag or file kind: "--cluster", "config file")."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise InputError(f"{what} {path!r} is a directory, not a YAML file; pass the path of "
                         "a file") from None
    except OSError as e:
        raise InputError(f"{what} {_shown(path)} cannot be opened: {e.strerror or e}; "
                         f"{_OPEN_FIX.get(e.errno, 'check the path')}") from None
    with f:
        return safe_load(f)


_OPEN_FIX = {errno.ENAMETOOLONG: "check the path (each name at most 255 bytes)",
             errno.EACCES: "check its permissions (and its folders')"}


def _shown(path: str) -> str:
    """The path for a message: one over 80 characters is cut to its first 60."""
    return repr(path) if len(path) <= 80 else f"{repr(path[:60])[:-1]}...' ({len(path)} characters)"


def _text(stream) -> Any:
    """The YAML text of `stream`: a str as it is; bytes, or a file's, decoded as UTF-8 (a byte
    order mark allowed), not as the locale's encoding (Latin-1 under LANG=en_US)."""
    if isinstance(stream, str):
        return stream
    name = getattr(stream, "name", "<stream>")
    if isinstance(stream, (bytes, bytearray)):
        data = bytes(stream)
    else:
        try:
            # a text file's bytes, read past its decoder; a StringIO has none and gives str
            data = getattr(stream, "buffer", stream).read()
        except OSError as e:
            raise InputError(f"{_shown(str(name))} cannot be read: {e.strerror or e}; check "
                             "the file and the disk it is on") from None
        if isinstance(data, str):
            return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"{_shown(str(name))} is not UTF-8 text (byte 0x{data[e.start]:02x} at "
                         f"offset {e.start}: {e.reason}); save it as UTF-8 (iconv -f LATIN1 -t "
                         "UTF-8 OLD > NEW for a Latin-1 file) and pass that") from None
