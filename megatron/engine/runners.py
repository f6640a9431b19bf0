"""How the engine runs each pipeline schedule: the runner a schedule's record names
(config/schedules, Schedule.runner) to the function that sets DeepSpeed's PipelineEngine up for
it. A schedule the engine can run is one record plus one register_runner call; a record that
names no runner, or one nobody registered, is priced by the planner only and the trainer
refuses it at start-up (runner_error).

Torch- and DeepSpeed-free: start-up checks a config against it before any rendezvous. A runner
imports what it needs when it runs, after Engine has imported deepspeed with its stand-ins."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from megatron.config import schedules
from megatron.config.errors import ConfigError

# (the DeepSpeed engine, the module it wraps, the schedule's name) -> what it changed, for
# the log ("" when nothing)
Install = Callable[[Any, Any, str], str]

RUNNERS: Dict[str, Install] = {}


def register_runner(runner: str, install: Install) -> None:
    """`install` runs the schedules whose record names `runner`. The same function again
    changes nothing; another one under a registered id is an error."""
    known = RUNNERS.get(runner)
    if known is not None and known is not install:
        raise ValueError(f"pipeline schedule runner {runner!r} is already registered "
                         f"({known.__qualname__}); pick another id")
    RUNNERS[runner] = install


def runnable() -> Tuple[str, ...]:
    """The registered schedules this engine can run."""
    return tuple(name for name in schedules.names() if schedules.get(name).runner in RUNNERS)


def runner_error(schedule: str) -> Optional[ConfigError]:
    """Why the trainer cannot run `schedule` (a record without a registered runner), or None."""
    record = schedules.get(schedule)
    if record.runner in RUNNERS:
        return None
    return ConfigError("parallel.pipeline_schedule", schedule,
                       f"a schedule this trainer runs: one of {', '.join(runnable())} "
                       f"({schedule}, {record.title}, is priced by megatron-plan only: no engine "
                       "runner is registered for it)",
                       f"set parallel.pipeline_schedule={schedules.DEFAULT} or another of those")


def install(engine, module, schedule: str) -> str:
    """Sets `engine` up to train with `schedule`; returns what changed, for the log."""
    error = runner_error(schedule)
    if error is not None:
        raise error
    return RUNNERS[schedules.get(schedule).runner](engine, module, schedule)


def _deepspeed(engine, module, schedule: str) -> str:
    """DeepSpeed's own TrainSchedule: the PipelineEngine runs it as built."""
    return ""


def _zero_bubble(engine, module, schedule: str) -> str:
    """engine/zero_bubble.py: B and W as separate instructions in pipe_order's lock steps. It
    subclasses DeepSpeed's classes when imported, so it is imported here, not above."""
    from megatron.engine.zero_bubble import use_zero_bubble
    return f"weight gradients of {use_zero_bubble(engine, module, schedule)} layers deferred"


def _interleaved(engine, module, schedule: str) -> str:
    """engine/interleaved.py: the project's own executor over this rank's model chunks
    (engine/chunks.py), the update left to the plain DeepSpeed engine that wraps them."""
    from megatron.engine.interleaved import use_interleaved
    return use_interleaved(engine, module, schedule)


register_runner("deepspeed", _deepspeed)
register_runner("zero_bubble", _zero_bubble)
register_runner("virtual_stages", _interleaved)
# ZB-V: the same executor; the module's chunks and order are the V's (chunks.PLACEMENTS)
register_runner("v_stages", _interleaved)
