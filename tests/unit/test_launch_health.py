"""The node health check (launch/health.py) and what the job chain does with a failed node:
named in <run.dir>/bad_nodes once per node, left out of the next job with sbatch --exclude, and
a chain stops when more nodes fail than a bad node or two explains."""
import pytest
import torch

from megatron.base.rundir import RunDir
from megatron.config.errors import InputError
from megatron.launch import health
from megatron.training import chain


def test_a_healthy_cpu_node_passes_and_a_failing_command_is_named():
    assert health.check_node(torch.device("cpu"), 1, {}) == []
    (problem,) = health.check_node(torch.device("cpu"), 1, {
        health.HEALTH_COMMAND: "echo 'GPU 3: uncorrectable ECC' >&2; exit 7"})
    assert "exited 7" in problem and "uncorrectable ECC" in problem


def test_a_gemm_off_its_reference_fails_the_node(monkeypatch):
    monkeypatch.setattr(health, "GEMM_TOLERANCE", 0.0)  # fp32 rounding is then a fault
    (problem,) = health.check_node(torch.device("cpu"), 1, {})
    assert "GEMM" in problem and "float64 reference" in problem


def test_the_node_is_named_as_slurm_names_it():
    assert health.node_name({"SLURMD_NODENAME": "frontier00042"}) == "frontier00042"
    assert health.node_name({})  # the host name otherwise


def test_bad_nodes_are_kept_once_each_in_order(tmp_path):
    run = RunDir(str(tmp_path / "run"))
    assert run.read_bad_nodes() == []
    for node in ("n3", "n1", "n3"):
        run.add_bad_node(node, "GEMM off")
    assert run.read_bad_nodes() == ["n3", "n1"]


def test_the_next_job_excludes_them_up_to_a_cap():
    line = "\x1f".join(["job", "acct", "normal", "batch", "2:00:00", "2", "", "", "/w",
                        "/s.sbatch"])
    cmd = chain.sbatch_command("9", line, [], exclude=["n3", "n1"])
    assert "--exclude=n3,n1" in cmd and cmd[-2:] == ["--", "/s.sbatch"]
    assert chain.excluded_nodes(["n1"], {}) == ["n1"]
    with pytest.raises(InputError, match="systematic fault"):
        chain.excluded_nodes(["a", "b", "c"], {chain.MAX_EXCLUDED: "2"})


def test_ranks_are_grouped_by_node_in_rank_order():
    assert health.ranks_by_node(["n1", "n1", "n2", "n1"]) == {"n1": [0, 1, 3], "n2": [2]}


def test_a_rank_alone_on_its_node_has_no_link_to_time():
    """A world of one joins no group and runs no collective."""
    assert health.check_node_link(["n1"], 0, torch.device("cpu"), {}) == []


@pytest.mark.parametrize("value", ["abc", "-1", "inf", "nan", "\u0661"])
def test_a_bad_link_floor_is_one_message_before_the_job_forms(value):
    """MEGATRON_HEALTH_MIN_GBPS=abc was a ValueError traceback on every rank, inside the link
    check after the process group had formed; now check_node, which runs first, refuses it."""
    env = {health.MIN_GBPS_ENV: value}
    with pytest.raises(InputError, match=rf"environment variable MEGATRON_HEALTH_MIN_GBPS="
                       rf"'{value}' is invalid: expected .* GB/s \(a number >= 0; default 0.01 "
                       rf"here\); set it to a number or unset it"):
        health.check_node(torch.device("cpu"), 1, env)
    assert health.min_gbps({health.MIN_GBPS_ENV: "2.5"}, "cpu") == 2.5
    assert health.min_gbps({}, "cpu") == health.MIN_GBPS["cpu"]
    assert health.min_gbps({health.MIN_GBPS_ENV: "0"}, "cuda") == 0.0
