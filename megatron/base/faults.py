"""Test-only fault hooks read from the environment: faults the fault tests inject into a real run
(per-file storage latency), in one place so a reader can see every way a test can bend a run.
Each is a no-op unless its variable is set; none is a setting for users.

Hooks older than this module still live beside the code they bend: MEGATRON_TEST_STOP_AT
(training/watchdog.py), MEGATRON_TEST_CORRUPT (training/sdc.py), MEGATRON_TEST_FAIL_WRITER and
MEGATRON_TEST_SLOW_WRITER (checkpoint/sharded.py)."""
from __future__ import annotations

import os
import time

# Seconds added to every fsync of a checkpoint's file or folder, the start-up probe's included:
# a loaded parallel file system, where each file costs a round trip to the metadata server.
SLOW_FILES_VAR = "MEGATRON_TEST_SLOW_FILES"


def file_latency() -> None:
    """Waits MEGATRON_TEST_SLOW_FILES seconds, when set (called before each fsync)."""
    value = os.environ.get(SLOW_FILES_VAR)
    if value:
        time.sleep(float(value))
