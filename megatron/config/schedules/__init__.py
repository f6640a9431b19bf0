"""Pipeline schedules as records (parallel.pipeline_schedule): registry.py holds the record and
the registry; each schedule is one file here that registers itself when this package imports it.
A new schedule: a file with its record (name, rule, closed forms, runner id), imported below;
for the trainer to run it, a runner registered in engine/runners.py under that id."""
from megatron.config.schedules.registry import (Pipe, Schedule, StageKinds, fill, get, names,
                                                register, unregister, with_runner)
from megatron.config.schedules import one_f_one_b, zbh1  # noqa: F401  (they register themselves)
from megatron.config.schedules import interleaved  # noqa: F401,E402  (after them: names() order)
from megatron.config.schedules import zbv  # noqa: F401,E402

# parallel.pipeline_schedule's default, registered first: DeepSpeed's own schedule, and what the
# planner prices for a single stage (one stage has no pipeline to order)
DEFAULT = one_f_one_b.ONE_F_ONE_B.name

__all__ = ["DEFAULT", "Pipe", "Schedule", "StageKinds", "fill", "get", "names", "register",
           "unregister", "with_runner"]
