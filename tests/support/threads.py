"""This process's threads by their kernel names (/proc/self/task/*/comm), which names the threads
Python does not know, such as a gloo group's (GLOO_THREADS); imported by bare name from the
workers launched by path (exit_threads_worker.py, groups_left_worker.py, shared_launch.py)."""
from __future__ import annotations

import os
from typing import List

GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")  # a gloo group's threads


def thread_names() -> List[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:  # a thread that ended while we looked
            pass
    return sorted(names)


def gloo_threads() -> int:
    """How many of this process's threads are gloo groups' (GLOO_THREADS)."""
    return sum(name in GLOO_THREADS for name in thread_names())
