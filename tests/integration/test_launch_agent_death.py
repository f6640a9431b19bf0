"""A torchrun worker's tie to its agent (megatron/launch/lifetime.py), with real processes: a
worker that is told (SIGTERM) when its agent dies instead of training on as an orphan."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.paths import ROOT


# A parent that starts a worker and is then killed, as SIGUSR1 kills torchrun's agent. The
# worker arms follow_launcher, records SIGTERM when it arrives, and otherwise would sleep on.
AGENT = """
import os, subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
time.sleep(60)
"""
WORKER = """
import os, signal, sys, time
from megatron.launch.env import LaunchEnv
from megatron.launch.lifetime import follow_launcher
marker = sys.argv[1]
def on_term(signum, frame):
    # written whole, then renamed: the test reads the marker as soon as it exists
    with open(marker + ".tmp", "w") as f:
        f.write("SIGTERM")
    os.replace(marker + ".tmp", marker)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
armed = follow_launcher(LaunchEnv(0, 2, 0, "127.0.0.1", 29500, "torchrun"))
with open(marker + ".armed.tmp", "w") as f:  # whole, then renamed, as the SIGTERM marker
    f.write(str(armed))
os.replace(marker + ".armed.tmp", marker + ".armed")
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux")
def test_worker_is_signalled_when_its_agent_dies(tmp_path):
    marker = str(tmp_path / "worker")
    env = dict(os.environ, PYTHONPATH=ROOT, TORCHELASTIC_RUN_ID="test")
    agent = subprocess.Popen([sys.executable, "-c", AGENT, WORKER, marker], env=env)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(marker + ".armed") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert open(marker + ".armed").read() == "True"
        agent.send_signal(signal.SIGUSR1)  # default action: the agent dies, nothing forwarded
        agent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists(marker), "the orphaned worker was not told its agent died"
        assert open(marker).read() == "SIGTERM"
    finally:
        if agent.poll() is None:
            agent.kill()
