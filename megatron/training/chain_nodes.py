"""Which nodes a job chain leaves out (training/chain.py decides when; this module says which):
the nodes whose task died first in a job, read from srun's stderr, and the exclusion plan for
the next job, bounded by MEGATRON_CHAIN_MAX_EXCLUDED and by what the partition can still hold.

A task that died first: chain.sh's megatron_chain_srun copies srun's stderr to a file
(MEGATRON_CHAIN_SRUN_LOG for `chain end`). With --kill-on-bad-exit, srun names each task that
ended badly ("srun: error: n2: task 1: Killed"), the first ones before its own line about
terminating the step; the tasks it ends after that are not the cause. A first task that died of
a signal (Killed, Segmentation fault, Bus error, ...), exited with a status megatron-train does
not give for a clean failure (CLEAN_EXITS), or whose node failed, puts its node in bad_nodes.
Standard library only, like the chain."""
from __future__ import annotations

import logging
import re
import subprocess
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from megatron.base.rundir import RunDir
from megatron.config.errors import InputError

if TYPE_CHECKING:
    from megatron.training.chain import JobFacts

log = logging.getLogger(__name__)

MAX_EXCLUDED = "MEGATRON_CHAIN_MAX_EXCLUDED"
# megatron-train's own ends (cli/common.py, training/watchdog.py): bad input, diverged, a hang
# seen by this rank's watchdog, a node that failed its health check (already in bad_nodes),
# interrupted. A first task that ended so is no dead node; nor one that was stopped (SIGTERM,
# SIGINT: scancel, preemption, the time limit).
CLEAN_EXITS = {2, 3, 4, 5, 130}
STOPPED = ("Terminated", "Interrupt")

# --- Nodes whose task died first ---------------------------------------------------------------

# srun's report of a task that ended badly, and its lines that start ending the step: what
# follows them was done by srun (or by scancel, the time limit), not by a fault.
_TASK_END = re.compile(r"^srun: error: (\S+): tasks? ([0-9,\-]+): (.+?)\s*$")
_NODE_FAIL = re.compile(r"^srun: error: (?:Node failure on|.*failed on node) (\S+?):?(?:\s|$)")
_STEP_ENDS = re.compile(r"^srun: (?:launch/slurm: _step_signal: Terminating|Force Terminated|"
                        r"Job step aborted)|\*\*\* (?:STEP|JOB) \S+ .*CANCELLED")


@dataclass(frozen=True)
class DeadTask:
    node: str
    tasks: str  # srun's spelling: "1", "0-7", "1,3"
    how: str    # "Killed", "Segmentation fault", "Exited with exit code 1", "node failure"


def first_dead_tasks(srun_stderr: str) -> List[DeadTask]:
    """The tasks srun reported ending badly before it began ending the step, less those that
    ended the way megatron-train ends cleanly (CLEAN_EXITS) or were stopped (STOPPED)."""
    dead = []
    for line in srun_stderr.splitlines():
        if _STEP_ENDS.search(line):
            break
        task, lost = _TASK_END.match(line), _NODE_FAIL.match(line)
        if lost:
            dead.append(DeadTask(lost.group(1), "all", "node failure"))
        elif task and _is_fault(task.group(3)):
            dead.append(DeadTask(task.group(1), task.group(2), task.group(3)))
    return dead


def _is_fault(how: str) -> bool:
    code = re.fullmatch(r"Exited with exit code (\d+)", how)
    if code:
        return int(code.group(1)) not in CLEAN_EXITS
    return not how.startswith(STOPPED)


def first_exit_status(srun_stderr: str) -> Optional[int]:
    """The exit status of the first task srun reported exiting before it began ending the step
    (srun's own status is then that of a task it ended: 143 after one exited 3), or None."""
    for line in srun_stderr.splitlines():
        if _STEP_ENDS.search(line):
            break
        task = _TASK_END.match(line)
        code = task and re.fullmatch(r"Exited with exit code (\d+)", task.group(3))
        if code:
            return int(code.group(1))
    return None


def read_srun_log(job: JobFacts) -> Optional[str]:
    """srun's stderr of this job (job.srun_log), or None (not kept, or unreadable: a warning)."""
    if not job.srun_log:
        return None
    try:
        with open(job.srun_log, errors="replace") as f:
            return f.read()
    except OSError as e:
        log.warning("cannot read srun's stderr %s (%s): no node of a dead task is left out",
                    job.srun_log, e.strerror)
        return None


def record_dead_nodes(run_dir: str, job: JobFacts, srun_stderr: str) -> List[DeadTask]:
    """Adds the node of each task that died first (srun's stderr) to bad_nodes."""
    dead = first_dead_tasks(srun_stderr)
    run = RunDir(run_dir)
    for d in dead:
        run.add_bad_node(d.node, f"job {job.job_id}: task {d.tasks} ended first ({d.how})")
    return dead


# --- Which nodes the next job leaves out -------------------------------------------------------

# sinfo's compact states (%t) of nodes that take no new job.
_UNUSABLE = ("down", "drain", "drng", "fail", "failg", "futr", "inval", "unk", "boot", "npc")


def usable_nodes(partition: str) -> Optional[List[str]]:
    """The nodes of `partition` (every partition when empty) that may take a new job, from sinfo;
    None when sinfo cannot say."""
    cmd = ["sinfo", "-h", "-N", "-o", "%N %t"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    nodes = {}
    for line in out.stdout.splitlines():
        if len(line.split()) == 2:
            name, state = line.split()
            nodes[name] = not state.rstrip("*~#!%$@^-+").startswith(_UNUSABLE)
    return [name for name, ok in nodes.items() if ok]


def plan_exclusions(bad: Sequence[str], job: JobFacts,
                    usable: Optional[Sequence[str]]) -> Tuple[List[str], str]:
    """(the nodes to exclude, a sentence saying why) for the next job. More bad nodes than
    job.max_excluded: InputError (a systematic fault). Then the newest are dropped while the
    partition's usable nodes outside the exclusion could not hold job.nodes."""
    if len(bad) > job.max_excluded:
        raise InputError(f"{len(bad)} nodes were found bad along this chain "
                         f"({', '.join(bad)}), more than {MAX_EXCLUDED}={job.max_excluded}: a "
                         "systematic fault, not bad nodes; not submitting the next job. Look at "
                         "the reasons in the run directory's bad_nodes file, fix the cause, then "
                         "remove the file and submit again")
    keep = list(bad)
    if usable is None or not job.nodes:
        return keep, ""
    dropped = []
    while keep and len([n for n in usable if n not in keep]) < job.nodes:
        dropped.insert(0, keep.pop())
    if not dropped:
        return keep, ""
    free = len([n for n in usable if n not in bad])
    return keep, (f"leaving out {', '.join(bad)} would leave {free} usable node(s) of partition "
                  f"{job.partition or '(all)'} for a {job.nodes}-node job, which could never "
                  f"start: the next job does not leave out {', '.join(dropped)} (ask for fewer "
                  "nodes than the partition has, or add nodes)")
