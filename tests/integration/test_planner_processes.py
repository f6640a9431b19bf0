"""megatron-plan in processes of its own: the installed command's help, the import structure of
its modules, the batch script it writes parsed by bash."""
import subprocess
import sys

from megatron.planner import emit
from megatron.planner.profile import load_profile


def test_help_has_examples():
    proc = subprocess.run([sys.executable, "-m", "megatron.cli.plan", "--help"],
                          capture_output=True, text=True)
    assert proc.returncode == 0
    assert "examples:" in proc.stdout and "megatron-plan search --model 175b" in proc.stdout


def test_calibrate_does_not_import_the_subcommands():
    """plan_calibrate and plan_commands share plan_args; neither imports the other at load."""
    code = ("import sys; import megatron.cli.plan_calibrate; "
            "assert 'megatron.cli.plan_commands' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_frontier_sbatch_script_is_valid_bash():
    text = emit.sbatch_script(load_profile("frontier").spec, 16, "best.yaml")
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
