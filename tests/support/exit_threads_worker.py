"""megatron-train, launched by path under torchrun, that writes at interpreter exit (atexit, after
main returned and the process group was left) the names of this process's threads still alive
to <EXIT_THREADS_DIR>/rank<R>.json: a gloo group's threads there outlive the run into the
process's own teardown (tests/integration/test_launch_exit_teardown.py)."""
import atexit
import json
import os
import sys

from threads import thread_names  # a sibling: a script's folder is on its sys.path


def _report() -> None:
    names = thread_names()
    path = os.path.join(os.environ["EXIT_THREADS_DIR"], f"rank{os.environ['RANK']}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(sorted(names), f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    atexit.register(_report)
    from megatron.cli.train import main
    sys.exit(main())
