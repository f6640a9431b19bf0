"""megatron-plan as a person uses it: help, tables, files, and one-line errors without a
traceback. Failures point at megatron/cli/plan*.py."""
import subprocess
import sys

import pytest

from megatron.cli.plan import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_has_examples():
    proc = subprocess.run([sys.executable, "-m", "megatron.cli.plan", "--help"],
                          capture_output=True, text=True)
    assert proc.returncode == 0
    assert "examples:" in proc.stdout and "megatron-plan search --model 175b" in proc.stdout


def test_search_prints_a_table_and_writes_files(capsys, tmp_path):
    cfg, sbatch = tmp_path / "best.yaml", tmp_path / "best.sbatch"
    code, out, _ = run(capsys, "search", "--model", "gpt3-1.3b", "--cluster", "a100", "--nodes",
                       "1", "--global-batch", "64", "--top", "3", "--out-config", str(cfg),
                       "--out-sbatch", str(sbatch))
    assert code == 0
    assert "TFLOPs/GPU" in out and "bubble %" in out
    assert cfg.exists() and "python -m megatron.cli.train --config" in sbatch.read_text()


def test_memory_of_the_paper_recipe(capsys):
    code, out, _ = run(capsys, "memory", "--model", "175b", "--nodes", "16", "--global-batch",
                       "1280", "--tp", "4", "--pp", "16", "--zero", "1", "--recompute", "full")
    assert code == 0
    assert "fits" in out and "bubble 2.3%" in out


@pytest.mark.parametrize("argv,needle", [
    (("search", "--model", "9b"), "--model='9b' is invalid"),
    (("search",), "name the model"),
    (("search", "--model", "175b", "--cluster", "nowhere.yaml"), "nowhere.yaml"),
    (("search", "--config", "missing.yaml"), "missing.yaml"),
    (("search", "--model", "175b", "--micro-batches", "1,x"), "--micro-batches"),
    (("memory", "--model", "175b", "--tp", "3"), "--tp x --pp"),
    (("memory", "--model", "175b", "--nodes", "16", "--tp", "8", "--pp", "3"), "--tp x --pp"),
    (("search", "--model", "1t", "--nodes", "1"), "no layout of 8 devices fits"),
    (("scaling", "--model", "175b", "--nodes", "16,x"), "--nodes"),
])
def test_bad_input_is_one_clear_line(capsys, argv, needle):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert needle in err and "Traceback" not in err
    assert err.strip().count("\n") == 0


def test_bad_cluster_file_names_the_field(capsys, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("gpu_memory_gb: 64\npeak_tflops: fast\ngpus_per_node: 8\n"
                    "intra_node_gbps: 50\ninter_node_gbps: 100\n")
    code, _, err = run(capsys, "search", "--model", "22b", "--cluster", str(path))
    assert code == 2 and "cluster.peak_tflops" in err


def test_cluster_file_is_used(capsys, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: mine\ngpu_memory_gb: 80\npeak_tflops: 300\ngpus_per_node: 4\n"
                    "intra_node_gbps: 200\ninter_node_gbps: 50\nconstants: {gemm_eff: 0.5}\n")
    code, out, _ = run(capsys, "search", "--model", "gpt3-1.3b", "--cluster", str(path),
                       "--nodes", "2", "--global-batch", "64", "--top", "2")
    assert code == 0 and "cluster: mine, 2 node(s) x 4 = 8 devices" in out


def test_scaling_table_and_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs the 'plan' extra (matplotlib)")
    png = tmp_path / "scaling.png"
    code, out, _ = run(capsys, "scaling", "--model", "175b", "--nodes", "16,32,64,128",
                       "--global-batch", "1280", "--tp", "4", "--pp", "16", "--recompute",
                       "full", "--plot", str(png))
    assert code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "weak" in out and "strong" in out
