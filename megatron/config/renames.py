"""Keys that moved to another section (sections.MOVED): a mapping of sections written with an
old key is rewritten to the new home with one warning that names it, so YAML files, --set
overrides and the config.yaml of run directories written by older versions still load."""
from __future__ import annotations

import logging
from typing import Any, Dict

from megatron.config.errors import ConfigError
from megatron.config.sections import MOVED

log = logging.getLogger(__name__)


def new_key(section: str, name: str, where: str = ""):
    """(section, name) of a key's home now: itself, or where it moved (with one warning)."""
    if (section, name) not in MOVED:
        return section, name
    new_section, new_name = MOVED[section, name]
    log.warning("%s.%s is now %s.%s%s; write the new name", section, name, new_section,
                new_name, where)
    return new_section, new_name


def relocate(sections: Dict[str, Dict[str, Any]], where: str = "") -> Dict[str, Dict[str, Any]]:
    """A copy of `sections` (section -> key -> value) with every moved key in its new section,
    and one warning line naming them all (a config.yaml of an older version holds every moved
    key: one line, not 25). The old and the new key both set is an error (which one holds?)."""
    out = {name: dict(values) if isinstance(values, dict) else values
           for name, values in sections.items()}
    moved = []
    for (old_section, name), (section, new_name) in MOVED.items():
        values = out.get(old_section)
        if not isinstance(values, dict) or name not in values:
            continue
        value = values.pop(name)
        target = out.setdefault(section, {})
        if "." in new_name:  # into a sub-section (model.moe.top_k)
            sub, new_name = new_name.split(".", 1)
            target[sub] = dict(target.get(sub) or {})
            target, section = target[sub], f"{section}.{sub}"
        if new_name in target:
            raise ConfigError(f"{old_section}.{name}", value, f"unset: it is now "
                              f"{section}.{new_name}, which is set too{where}",
                              f"keep only {section}.{new_name}")
        target[new_name] = value
        moved.append(f"{old_section}.{name} is now {section}.{new_name}")
    if moved:
        log.warning("%s%s; write the new name%s", ", ".join(moved), where,
                    "s" if len(moved) > 1 else "")
    return out
