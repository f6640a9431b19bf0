"""Why the planner leaves a layout out: a one-line message (a str, as printed) that carries
`key`, what a search's summary counts it under, so that no caller parses a message's wording."""
from __future__ import annotations

import re
from typing import Optional

from megatron.config.errors import ConfigError

_ASIDE = re.compile(r" \([^()]*\)")


class Problem(str):
    """The message, and `key`: the message itself unless given."""
    key: str

    def __new__(cls, message: str, key: Optional[str] = None) -> "Problem":
        problem = super().__new__(cls, message)
        problem.key = message if key is None else key
        return problem


def without_asides(text: str) -> str:
    """The text without its parenthesised asides (nested ones too)."""
    while _ASIDE.search(text):
        text = _ASIDE.sub("", text)
    return text


def problem_key(problem: str) -> str:
    """What a search's summary counts a problem under: a Problem's key, else the message
    without its figures in parentheses."""
    return problem.key if isinstance(problem, Problem) else without_asides(problem)


def config_problem(error: Optional[ConfigError]) -> Optional[Problem]:
    """A trainer rule's error as a Problem keyed by its field, value and rule: the expectation
    without its figures in parentheses (the layout's own numbers, which would split one rule
    into many keys) and without the fix (a search's summary is not the place for it)."""
    if error is None:
        return None
    return Problem(str(error), f"{error.field}={error.value!r} is invalid: expected "
                               f"{without_asides(error.expected)}")
