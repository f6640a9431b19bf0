"""The registry of pipeline schedules (parallel.pipeline_schedule). A schedule is a record: its
name, the rule of the layouts it runs on, the closed forms the planner prices it by, and the id
of the engine runner that runs it. Each lives in a file of its own in this package and registers
itself on import; nothing else branches on its name (docs/architecture.md, "Extension points").

Records are plain data and functions, torch-free: the config checks a name and its rule when a
config is loaded, the planner prices it on a login node, the engine (engine/runners.py) maps
its `runner` to how DeepSpeed's pipeline engine runs it."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from megatron.config import plugins
from megatron.config.errors import ConfigError

# A name is typed in YAML, --set and megatron-plan's comma-separated --schedules
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclass(frozen=True)
class Pipe:
    """What a schedule's closed forms read of a layout: p stages, m micro-batches per step and
    pipeline, v model chunks per stage (more than one only in the planner's comparison with
    Megatron-LM's interleaving, Layout.interleave: this trainer's runners hold one)."""
    stages: int
    micro_batches: int
    chunks: int = 1
    # interleaved: the micro-batches a chunk takes in a row (parallel.pipeline_microbatch_
    # group); 0: the stages
    group: int = 0


# Per kind of stage: the features of one micro-batch through it (a vector, numpy's in the
# planner) and how many stages are of that kind; a schedule's pipeline_time composes them.
StageKinds = Sequence[Tuple[Any, int]]


def no_rule(pp: int, cp: int, chunks: int) -> Optional[ConfigError]:
    return None


def ends_only(pipe: Pipe, num_layers: int) -> Tuple[int, ...]:
    return ()


@dataclass(frozen=True)
class Schedule:
    name: str
    # a few words, for help texts and the comments of the files megatron-plan writes
    title: str
    # what the planner prices, as `megatron-plan memory` states it after the name
    priced: str
    # idle share of a balanced pipeline, given the share of a stage's time its W passes take
    # (split_backward schedules; 0 otherwise)
    bubble: Callable[[Pipe, float], float]
    # activation bytes stage `stage` holds at its peak, from the bytes one micro-batch keeps
    # between its forward and backward (per_mb) and, split_backward, between its B and W (per_w)
    stored: Callable[[Pipe, int, float, float], float]
    # one step's pipeline features: (pipe, stage kinds, the W share of each kind, the index of
    # the slowest kind) -> features (timing.pipeline_features)
    pipeline_time: Callable[[Pipe, StageKinds, Sequence[Any], int], Any]
    # why a layout of pp stages, cp context-parallel ranks and `chunks` chunks per stage cannot
    # run it: one ConfigError naming parallel.pipeline_schedule, or None
    rule: Callable[[int, int, int], Optional[ConfigError]] = no_rule
    # the engine runner that runs it (engine/runners.py); None: priced by the planner only, and
    # refused by the trainer at start-up
    runner: Optional[str] = None
    # each backward runs as B (the input gradient) and a later W (the weight gradients): the
    # planner prices W's share and its pending bytes
    split_backward: bool = False
    # its order is DeepSpeed's TrainSchedule lock steps (W passes added where split_backward):
    # engine/pipe_order writes and replays it
    lock_steps: bool = False
    # stages besides the first and last that may hold the peak memory (memory.peak_memory)
    peak_stages: Callable[[Pipe, int], Tuple[int, ...]] = ends_only
    # the schedule the trainer runs this one as with several model chunks per stage (the
    # planner prices 1f1b with chunks as Megatron-LM's interleaved 1F1B; it writes that config
    # as this record's `chunked`); None: the same name
    chunked: Optional[str] = None
    # the chunks run in a V that ends on the first stage: it holds the output layer, the final
    # norm and the loss beside the embedding (ZB-V); otherwise the last stage does
    head_on_first: bool = False
    # the engines megatron-plan prices (planner/overlap.py's names) that run it; None: every
    # one. The planner refuses a layout with it under another (layout.engine_run_problem).
    engines: Optional[Tuple[str, ...]] = None

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise ValueError(f"pipeline schedule name {self.name!r}: lower-case letters, digits, "
                             "'-' and '_' only (it is typed in YAML and comma-separated lists)")


_RECORDS: Dict[str, Schedule] = {}


def register(schedule: Schedule) -> Schedule:
    """Adds `schedule` under its name and returns it. The same record again changes nothing;
    another record under a registered name is an error, never a silent replacement."""
    known = _RECORDS.get(schedule.name)
    if known is not None and known != schedule:
        raise ValueError(f"pipeline schedule {schedule.name!r} is already registered by another "
                         f"record ({known.title}); pick another name")
    _RECORDS[schedule.name] = schedule
    return schedule


def unregister(name: str) -> None:
    """Removes a schedule (a test's own, or a plug-in's); the default (the first registered,
    schedules.DEFAULT) stays."""
    if _RECORDS and name == next(iter(_RECORDS)):
        raise ValueError(f"the default pipeline schedule {name!r} cannot be unregistered")
    _RECORDS.pop(name, None)


def names() -> Tuple[str, ...]:
    """Every registered schedule, in registration order (the default first)."""
    return tuple(_RECORDS)


def with_runner() -> Tuple[str, ...]:
    """The schedules whose record names an engine runner: what the search tries by default."""
    return tuple(name for name, record in _RECORDS.items() if record.runner is not None)


def get(name: str) -> Schedule:
    record = _RECORDS.get(name)
    if record is None:
        raise ConfigError("parallel.pipeline_schedule", name, f"one of {', '.join(names())}",
                          plugins.registry_fix("parallel.pipeline_schedule"))
    return record


def fill(stages: StageKinds, slowest: int):
    """The features of every stage's micro-batch but one of the slowest: the fill and drain of
    a pipeline whose slowest stage runs m slots."""
    return sum(f * n for f, n in stages) - stages[slowest][0]
