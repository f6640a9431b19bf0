"""cli.common.entry_point: every command's one error path, and who may end the process."""
import torch.distributed as dist

from megatron.cli.plan import main as plan_main


def test_an_error_returns_to_a_caller_whose_process_group_is_open(capsys, tmp_path):
    """A program (or a test) that calls main() as a function with its own process group open
    gets the exit status back; the process is not ended under it (os._exit is kept for a command
    that opened the group itself, where sys.exit could hang on peers)."""
    opened = not dist.is_initialized()
    if opened:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                                world_size=1)
    try:
        code = plan_main(["memory", "--model", "no-such-model", "--cluster", "frontier"])
        err = capsys.readouterr().err
    finally:
        if opened:
            dist.destroy_process_group()
    assert code == 2
    assert err.startswith("megatron-plan: error: ") and len(err.strip().splitlines()) == 1, err
