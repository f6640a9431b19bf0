"""megatron-train as a separate process: the command line, a clean environment and the checks
every "one clear error" test makes on what it printed."""
import os
import subprocess
import sys

from tests.support.paths import ROOT

BIN = os.path.dirname(sys.executable)
ENTRY = (os.path.join(BIN, "megatron-train") if os.path.exists(os.path.join(BIN, "megatron-train"))
         else None)
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def clean_env(**extra) -> dict:
    """The caller's environment without launcher variables (pytest may itself run in a job)."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_"))}
    env.update(extra)
    return env


def train_cmd(*args) -> list:
    head = [ENTRY] if ENTRY else [sys.executable, "-m", "megatron.cli.train"]
    return head + list(args)


def run_cli(args, env) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd(*args), capture_output=True, text=True, env=env,
                          timeout=60, cwd=ROOT)


def script_result(script: str, *args: str, timeout: float = 600) -> dict:
    """Runs `script` in a fresh Python process (python -c, the repository as its directory, a
    clean environment) with `args`, and returns the JSON it printed on its line "RESULT ..."."""
    import json
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=clean_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(s for s in proc.stdout.splitlines() if s.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def assert_clean_error(proc, *fragments):
    assert proc.returncode != 0, f"expected failure, got exit 0:\n{proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, f"{fragment!r} not in stderr:\n{proc.stderr}"


def sets(*items):
    return [a for item in items for a in ("--set", item)]
