"""A cluster file (megatron-plan --cluster FILE) and a YAML file that is not text: every bad value
is one line that names the field, the value, what was expected and the file, exit 2, before
anything is printed or written. Failures point at megatron/planner/hardware.py (the cluster
fields) and megatron/config/strict_yaml.py (reading the file)."""
import os

import pytest

from megatron.cli.plan import main
from megatron.config import InputError, strict_yaml

SEARCH = ("search", "--model", "gpt3-1.3b", "--nodes", "1", "--global-batch", "64", "--top", "1")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cluster_file(tmp_path, text: str):
    path = tmp_path / "cluster.yaml"
    path.write_text("base: a100\n" + text + "\n")
    return path


def assert_refused(capsys, tmp_path, text: str, *needles: str):
    """search --out-sbatch on a cluster file with `text`: one line on stderr naming the file and
    each needle, exit 2, nothing on stdout and no sbatch script."""
    path = cluster_file(tmp_path, text)
    sbatch = tmp_path / "best.sbatch"
    code, out, err = run(capsys, *SEARCH, "--cluster", str(path), "--out-sbatch", str(sbatch))
    assert code == 2, (code, out, err)
    assert out == "" and not sbatch.exists()
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    assert f"fix it in {path}" in err, err
    for needle in needles:
        assert needle in err, err


@pytest.mark.parametrize("text,value", [
    ("name: 123", "123"),
    ("name: [1]", "[1]"),
    ("name: ''", "''"),
    ("name: '  '", "'  '"),
    ('name: "my\\ncluster"', "'my\\ncluster'"),
    ('name: "my\\tcluster"', "'my\\tcluster'"),
    ("name: null", "None"),
])
def test_a_cluster_name_must_be_one_line_of_text(capsys, tmp_path, text, value):
    """123 was an AttributeError ('int' has no attribute 'lower') after the table was printed; a
    newline went into the sbatch script's comment line, the rest of the name a command."""
    assert_refused(capsys, tmp_path, text, f"cluster.name={value} is invalid",
                   "expected a non-empty string of printable characters")


@pytest.mark.parametrize("text,field_value,expected", [
    ("launcher_env: 5", "cluster.launcher_env=5", "a mapping of environment variable names"),
    ("launcher_env: [1]", "cluster.launcher_env=[1]", "a mapping of environment variable names"),
    ("launcher_env: {1BAD: x}", "cluster.launcher_env='1BAD'", "[A-Za-z_][A-Za-z0-9_]*"),
    ("launcher_env: {1: x}", "cluster.launcher_env=1", "[A-Za-z_][A-Za-z0-9_]*"),
    ("launcher_env: {'A B': x}", "cluster.launcher_env='A B'", "[A-Za-z_][A-Za-z0-9_]*"),
    ("launcher_env: {A: [1]}", "cluster.launcher_env.A=[1]", "a string or a number"),
    ("launcher_env: {A: {b: 1}}", "cluster.launcher_env.A={'b': 1}", "a string or a number"),
    ("launcher_env: {A: null}", "cluster.launcher_env.A=None", "a string or a number"),
    ("launcher_env: {A: true}", "cluster.launcher_env.A=True", "quote true/false"),
    ("launcher_env: {A: .nan}", "cluster.launcher_env.A=nan", "a string or a number"),
    ('launcher_env: {A: "x\\ny"}', "cluster.launcher_env.A='x\\ny'", "no newline"),
    ("launcher_env: {A: 'x\"; touch /tmp/p; \"'}", "cluster.launcher_env.A='x\"; touch",
     'export KEY="value"'),
    ("launcher_env: {A: '`id`'}", "cluster.launcher_env.A='`id`'", 'export KEY="value"'),
    ("launcher_env: {A: '$(id)'}", "cluster.launcher_env.A='$(id)'", 'export KEY="value"'),
    ("launcher_env: {A: 'a\\b'}", "cluster.launcher_env.A='a\\\\b'", 'export KEY="value"'),
])
def test_launcher_env_must_be_names_to_plain_values(capsys, tmp_path, text, field_value,
                                                    expected):
    """5 and [1] were AttributeError tracebacks ('items'); a value with a newline or a quote
    broke out of the sbatch script's export line."""
    assert_refused(capsys, tmp_path, text, f"{field_value}", "is invalid", expected)


@pytest.mark.parametrize("text,value,least", [
    ("gpus_per_node: 8.0", "8.0", 1),
    ("gpus_per_node: 2.5", "2.5", 1),
    ("gpus_per_node: 0", "0", 1),
    ("gpus_per_node: -8", "-8", 1),
    ("gpus_per_node: true", "True", 1),
    ("gpus_per_node: '8'", "'8'", 1),
    ("cpus_per_task: -3", "-3", 0),
    ("cpus_per_task: 2.5", "2.5", 0),
    ("cpus_per_task: 7.0", "7.0", 0),
    ("cpus_per_task: .inf", "inf", 0),
])
def test_a_count_must_be_a_whole_number(capsys, tmp_path, text, value, least):
    """gpus_per_node 8.0 was a TypeError in search (memory printed "8.0 devices"), 2.5 was taken;
    cpus_per_task -3 and 2.5 were written into the script as `srun ... -c -3`."""
    field = text.split(":")[0]
    assert_refused(capsys, tmp_path, text, f"cluster.{field}={value} is invalid",
                   f"expected a whole number >= {least}")


ABOVE_0 = "a finite number above 0"
NO_PAIR = f"{ABOVE_0}, or null where no device pair has a faster link"
QUARTER = f"{ABOVE_0}, or null for a quarter of peak_tflops"
NO_FP8 = f"{ABOVE_0}, or null where the device has no FP8"


@pytest.mark.parametrize("text,value,expected", [
    ("gpu_memory_gb: .inf", "inf", "a finite number above 0"),
    ("peak_tflops: .inf", "inf", "a finite number above 0"),
    ("intra_node_gbps: .inf", "inf", "a finite number above 0"),
    ("inter_node_gbps: -.inf", "-inf", "a finite number above 0"),
    ("hbm_gbps: .nan", "nan", "a finite number above 0"),
    ("intra_bus_eff: .inf", "inf", "a finite number above 0"),
    ("peak_tflops: fast", "'fast'", "a finite number above 0"),
    ("pair_gbps: .inf", "inf", NO_PAIR),
    ("pair_gbps: 0", "0", NO_PAIR),
    ("fp32_tflops: 0", "0", QUARTER),
    ("fp32_tflops: .nan", "nan", QUARTER),
    ("fp8_tflops: .inf", "inf", NO_FP8),
    ("intra_latency_us: .inf", "inf", "a finite number of microseconds >= 0"),
    ("inter_latency_us: -1", "-1", "a finite number of microseconds >= 0"),
])
def test_a_number_must_be_finite_and_in_its_domain(capsys, tmp_path, text, value, expected):
    """gpu_memory_gb .inf printed "inf GB", fp32_tflops 0 silently became peak/4, pair_gbps 0
    silently meant no pair link, an infinite latency priced every layout at inf."""
    field = text.split(":")[0]
    assert_refused(capsys, tmp_path, text, f"cluster.{field}={value} is invalid",
                   f"expected {expected}")


def test_the_documented_zeros_and_nulls_still_mean_what_they_say(capsys, tmp_path):
    """cpus_per_task 0 leaves -c to Slurm, latencies may be 0, null is "none" or the default."""
    path = cluster_file(tmp_path, "name: my-a100\ncpus_per_task: 0\nintra_latency_us: 0\n"
                                  "pair_gbps: null\nfp32_tflops: null\nlauncher_env: null")
    sbatch = tmp_path / "best.sbatch"
    code, out, err = run(capsys, *SEARCH, "--cluster", str(path), "--out-sbatch", str(sbatch))
    assert code == 0, err
    assert "cluster: my-a100, 1 node(s) x 8 = 8 devices" in out
    text = sbatch.read_text()
    assert " -c " not in text and "export " not in text


def test_the_sbatch_script_exports_launcher_env_exactly(capsys, tmp_path):
    path = cluster_file(tmp_path, "name: my-a100\ncpus_per_task: 7\nlauncher_env:\n"
                                  "  NCCL_DEBUG: WARN\n  OMP_NUM_THREADS: 4\n"
                                  "  NCCL_IB_HCA: 'mlx5_0,mlx5_1'\n  _SCRATCH: /scratch/$USER\n"
                                  "  EMPTY: ''")
    sbatch = tmp_path / "best.sbatch"
    code, _, err = run(capsys, *SEARCH, "--cluster", str(path), "--out-sbatch", str(sbatch))
    assert code == 0, err
    lines = sbatch.read_text().splitlines()
    assert [line for line in lines if line.startswith("export ")] == [
        'export NCCL_DEBUG="WARN"',
        'export OMP_NUM_THREADS="4"',
        'export NCCL_IB_HCA="mlx5_0,mlx5_1"',
        'export _SCRATCH="/scratch/$USER"',
        'export EMPTY=""',
    ]
    assert "# Generated by megatron-plan for my-a100: 1 node(s) x 8 devices." in lines
    srun = [line for line in lines if line.startswith("srun ")]
    assert len(srun) == 1 and " -c 7 " in srun[0]


@pytest.mark.parametrize("data,what", [
    (b"\xff\xfeb\x00a\x00s\x00e\x00:\x00 \x00a\x001\x000\x000\x00\n\x00", "byte 0xff at offset 0"),
    ("base: a100\nname: caf\xe9\n".encode("latin-1"), "byte 0xe9 at offset 20"),
])
def test_a_cluster_file_that_is_not_utf8_is_one_message(capsys, tmp_path, data, what):
    """It was a UnicodeDecodeError traceback from strict_yaml."""
    path = tmp_path / "cluster.yaml"
    path.write_bytes(data)
    code, out, err = run(capsys, *SEARCH, "--cluster", str(path))
    assert code == 2 and out == ""
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    assert f"{str(path)!r} is not UTF-8 text ({what}: " in err, err
    assert "save it as UTF-8" in err


def test_a_config_file_that_is_not_utf8_is_one_message(capsys, tmp_path):
    path = tmp_path / "best.yaml"
    path.write_bytes("training: {global_batch_size: 64}\n# caf\xe9\n".encode("latin-1"))
    code, out, err = run(capsys, "search", "--config", str(path), "--cluster", "a100")
    assert code == 2 and out == ""
    assert "Traceback" not in err and err.strip().count("\n") == 0, err
    assert f"{str(path)!r} is not UTF-8 text (byte 0xe9 at offset 39" in err, err


def test_a_utf8_file_with_a_byte_order_mark_or_accents_is_read(capsys, tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_bytes("\ufeffbase: a100\nname: caf\xe9\n".encode("utf-8"))
    code, out, err = run(capsys, "memory", "--model", "gpt3-1.3b", "--nodes", "1",
                         "--global-batch", "64", "--cluster", str(path))
    assert code == 0, err
    assert "cluster: caf\xe9, 1 node(s)" in out


def test_load_file_names_a_directory(tmp_path):
    with pytest.raises(InputError) as e:
        strict_yaml.load_file(str(tmp_path))
    assert str(e.value) == (f"the YAML file {str(tmp_path)!r} is a directory, not a YAML file; "
                            "pass the path of a file")


def test_a_directory_given_as_cluster_or_config_names_the_flag(capsys, tmp_path):
    code, out, err = run(capsys, "memory", "--model", "gpt3-1.3b", "--cluster", str(tmp_path))
    assert code == 2 and not out and f"--cluster {str(tmp_path)!r} is a directory" in err
    code, out, err = run(capsys, "memory", "--config", str(tmp_path), "--cluster", "a100")
    assert code == 2 and not out and f"config file {str(tmp_path)!r} is a directory" in err


def test_load_file_names_a_name_too_long(tmp_path):
    path = str(tmp_path / ("x" * 300 + ".yaml"))
    with pytest.raises(InputError) as e:
        strict_yaml.load_file(path)
    message = str(e.value)
    assert message.startswith("the YAML file " + repr(path[:60])[:-1] + "...' (")
    assert f"{len(path)} characters) cannot be opened: File name too long" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_load_file_names_an_unreadable_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: 1\n")
    path.chmod(0)
    with pytest.raises(InputError, match="cannot be opened: Permission denied"):
        strict_yaml.load_file(str(path))


def test_load_file_leaves_a_missing_file_to_its_caller(tmp_path):
    """Each caller has its own message for a missing file (which flag, an example file)."""
    with pytest.raises(FileNotFoundError):
        strict_yaml.load_file(str(tmp_path / "missing.yaml"))


def test_load_file_reads_yaml_and_refuses_bytes_that_are_not_utf8(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a: [1, 2]\n")
    assert strict_yaml.load_file(str(path)) == {"a": [1, 2]}
    path.write_bytes(b"a: \x80\n")
    with pytest.raises(InputError, match=r"is not UTF-8 text \(byte 0x80 at offset 3"):
        strict_yaml.load_file(str(path))
