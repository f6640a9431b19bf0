"""A real full disk for the tests of the writers: a tmpfs of a few KiB mounted under the test's
folder. Mounting needs root or CAP_SYS_ADMIN (CI's VM runs as root); the test is skipped with
the reason otherwise."""
import contextlib
import subprocess

import pytest


@contextlib.contextmanager
def tmpfs(folder, size: str):
    """Mounts a tmpfs of `size` (mount's form: 64k, 1m) on `folder`, created if needed; unmounted
    lazily afterwards, so a failing test cannot leave it mounted while a file is open."""
    folder.mkdir(exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs for a real full disk (needs root or "
                    f"CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)
