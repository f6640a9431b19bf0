"""The run-directory lock and checks (rundir.py) against other processes: a second run on the
directory, a lock left by a killed run, and a read-only directory (a bind mount when root)."""
import logging
import os
import signal
import subprocess
import sys

import pytest

from megatron.base.rundir import RunLock, check_run_dir
from megatron.config.errors import InputError


def test_a_second_run_on_the_directory_is_refused_with_the_holder(tmp_path):
    first = RunLock(str(tmp_path))
    first.acquire()
    # Another process (flock is per open file, so a second process is the real case).
    code = (f"from megatron.base.rundir import RunLock\n"
            f"RunLock({str(tmp_path)!r}).acquire()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    first.release()
    assert proc.returncode != 0
    assert "is in use by another run" in proc.stderr and f"pid {os.getpid()}" in proc.stderr


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, caplog):
    code = (f"import time\nfrom megatron.base.rundir import RunLock\n"
            f"RunLock({str(tmp_path)!r}).acquire()\nprint('held', flush=True)\ntime.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    lock = RunLock(str(tmp_path))
    with caplog.at_level(logging.INFO):
        lock.acquire()
    lock.release()
    assert f"pid {holder.pid}" in caplog.text and "has ended" in caplog.text


def test_read_only_run_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    os.chmod(ro, 0o555)
    try:
        if os.access(str(ro), os.W_OK) and os.geteuid() == 0:
            # root writes through permissions: a read-only bind mount is the real case
            mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)],
                                     capture_output=True).returncode == 0
            if not mounted:
                pytest.skip("running as root without a way to make a read-only directory")
        with pytest.raises(InputError, match="not writable"):
            check_run_dir(str(ro))
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)
        os.chmod(ro, 0o755)
