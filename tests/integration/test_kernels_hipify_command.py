"""tools/hipify_build.py run as a command: it writes the HIP tree and names each file it made."""
import os
import subprocess
import sys

from tests.support.paths import ROOT


def test_standalone_command(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "hipify_build.py"), "--out",
                           str(tmp_path / "hip")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "hipify: csrc/kernels/instantiate/norm.cu -> hip/kernels/instantiate/norm.hip" \
        in proc.stdout
