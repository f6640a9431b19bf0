"""Launch discovery from the environment alone: torchrun, Slurm (srun tasks), a lone process."""
import pytest

from megatron.config.errors import InputError
from megatron.launch.env import DEFAULT_PORT, LaunchEnv, discover, expand_nodelist


@pytest.mark.parametrize("nodelist, hosts", [
    ("n1", ["n1"]),
    ("frontier[00012-00013,00020]", ["frontier00012", "frontier00013", "frontier00020"]),
    ("a[1-3],b7", ["a1", "a2", "a3", "b7"]),
    ("x[008-011]", ["x008", "x009", "x010", "x011"]),  # zero padding kept across a carry
    ("x[8-11]", ["x8", "x9", "x10", "x11"]),  # no padding: widths grow
    ("n[1-2],login[5],c3", ["n1", "n2", "login5", "c3"]),
    ("login[1-2]-ib", ["login1-ib", "login2-ib"]),  # suffix after the bracket
])
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist, fragment", [
    ("a[3-1]", "'3-1'"), ("a[x-2]", "'x-2'"), ("a[1-", "'a[1-'"), ("a[1-3,5", "'a[1-3'"),
    ("", "names no host"),
    ("a[\u00b2-3]", "'\u00b2-3'"),  # isdigit() took it and int() raised a ValueError
])
def test_expand_nodelist_rejects_malformed(nodelist, fragment):
    with pytest.raises(InputError, match="SLURM_JOB_NODELIST") as e:
        expand_nodelist(nodelist)
    assert fragment in str(e.value)


def test_torchrun_env():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.5",
           "MASTER_PORT": "29999",
           # torchrun inside an allocation: torchrun's variables win over Slurm's
           "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]"}
    assert discover(env) == LaunchEnv(3, 8, 1, "10.0.0.5", 29999, "torchrun")


def test_torchrun_defaults():
    assert discover({"RANK": "0", "WORLD_SIZE": "2"}) == \
        LaunchEnv(0, 2, 0, "127.0.0.1", DEFAULT_PORT, "torchrun")


SLURM = {"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
         "SLURM_JOB_NODELIST": "frontier[00012-00013]", "SLURM_JOB_ID": "1234567"}


def test_slurm_env_master_is_first_host_and_port_from_job_id():
    launch = discover(SLURM)
    assert launch == LaunchEnv(9, 16, 1, "frontier00012", 20000 + 1234567 % 10000, "slurm")
    assert 20000 <= launch.master_port < 30000


def test_slurm_port_differs_between_jobs():
    ports = {discover(dict(SLURM, SLURM_JOB_ID=str(j))).master_port for j in range(100, 110)}
    assert len(ports) == 10


def test_slurm_master_port_override_and_master_addr_override():
    launch = discover(dict(SLURM, MASTER_PORT="31000", MASTER_ADDR="127.0.0.1"))
    assert (launch.master_addr, launch.master_port) == ("127.0.0.1", 31000)


def test_slurm_nodelist_fallback_and_missing():
    env = {k: v for k, v in SLURM.items() if k != "SLURM_JOB_NODELIST"}
    assert discover(dict(env, SLURM_NODELIST="b[7-8]")).master_addr == "b7"
    assert discover(env).master_addr == "127.0.0.1"
    no_job = {k: v for k, v in env.items() if k != "SLURM_JOB_ID"}
    assert discover(no_job).master_port == DEFAULT_PORT
    no_local = {k: v for k, v in SLURM.items() if k != "SLURM_LOCALID"}
    assert discover(no_local).local_rank == 0


def test_slurm_compressed_nodelist_with_other_hosts():
    env = dict(SLURM, SLURM_JOB_NODELIST="frontier[00020,00012-00013],login1")
    assert discover(env).master_addr == "frontier00020"  # Slurm's order, not sorted


def test_single_process():
    assert discover({}) == LaunchEnv(0, 1, 0, "127.0.0.1", DEFAULT_PORT, "single")
    assert discover({"MASTER_PORT": "12345"}).master_port == 12345


@pytest.mark.parametrize("env, name", [
    ({"RANK": "zero", "WORLD_SIZE": "2"}, "RANK"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "x"}, "MASTER_PORT"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT"),
    (dict(SLURM, SLURM_NTASKS="sixteen"), "SLURM_NTASKS"),
])
def test_bad_launcher_variables_name_the_variable(env, name):
    with pytest.raises(InputError, match=name):
        discover(env)


# A step on part of the allocation: srun -x <bad node>, or one node of an salloc. The job's
# first node runs nothing of this step, so the master must come from the step's node list.
STEP = dict(SLURM, SLURM_JOB_NODELIST="frontier[00012-00014]", SLURM_JOB_NUM_NODES="3",
            SLURM_STEP_NODELIST="frontier[00013-00014]", SLURM_STEP_NUM_NODES="2")


def test_slurm_step_nodelist_wins_over_the_jobs():
    launch = discover(STEP)
    assert (launch.master_addr, launch.num_nodes) == ("frontier00013", 2)


def test_slurm_node_count_falls_back_to_the_job_then_one():
    no_step = {k: v for k, v in STEP.items() if not k.startswith("SLURM_STEP_")}
    assert discover(no_step).master_addr == "frontier00012"
    assert discover(no_step).num_nodes == 3
    assert discover(dict(SLURM, SLURM_NNODES="4")).num_nodes == 4
    assert discover(SLURM).num_nodes == 1


def test_malformed_step_nodelist_names_the_step_variable():
    with pytest.raises(InputError, match="SLURM_STEP_NODELIST range '2-1'"):
        discover(dict(STEP, SLURM_STEP_NODELIST="x[2-1]"))


@pytest.mark.parametrize("extra, nodes", [
    ({"GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "4"}, 2),  # torchrun sets both
    ({"LOCAL_WORLD_SIZE": "4"}, 2),
    ({}, 1),
])
def test_torchrun_node_count(extra, nodes):
    assert discover(dict({"RANK": "0", "WORLD_SIZE": "8"}, **extra)).num_nodes == nodes


def test_steps_of_one_job_get_different_ports():
    # Two steps side by side may share their first node; step 0 keeps the job's port.
    ports = [discover(dict(STEP, SLURM_STEP_ID=str(i))).master_port for i in range(3)]
    assert ports[0] == discover(SLURM).master_port and len(set(ports)) == 3
