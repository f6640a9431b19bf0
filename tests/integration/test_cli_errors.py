"""Each config mistake through the real `megatron-train`: a non-zero exit, one message naming the
field and the value, and no traceback.

Layout mistakes that need a world of 2 run as rank 0 of a torchrun-style environment
(RANK/WORLD_SIZE set, nobody else launched): the entry point validates the layout before it
joins the process group, so the process must stop at once. One case runs under a real torchrun
with two ranks, whose per-rank stderr is read from torchrun's log directory."""
import glob
import subprocess
import sys

import pytest

from tests.support.cli import (ENTRY, assert_clean_error, clean_env, run_cli, sets,
                               train_cmd)
from tests.support.paths import TINY
from tests.support.procs import free_port, torchrun_cmd

WORLD_1 = [
    ("global_batch_not_multiple_of_micro_x_dp", sets("training.global_batch_size=15"),
     ["training.global_batch_size=15", "micro_batch_size x data-parallel size (2 x 1 = 2)"]),
    ("world_not_divisible_by_tp_x_pp", sets("parallel.tensor_parallel_size=2"),
     ["parallel.tensor_parallel_size=2", "divide the world size 1"]),
    ("unknown_key_in_set", sets("model.hiden_size=64"),
     ["model.hiden_size='64'", "known key of section 'model'", "hidden_size"]),
    ("unknown_section_in_set", sets("modle.hidden_size=64"), ["modle.hidden_size", "section"]),
    ("bad_type", sets("training.micro_batch_size=two"),
     ["training.micro_batch_size='two'", "an integer"]),
    ("bad_choice", sets("training.precision=fp8"), ["training.precision='fp8'", "fp32, bf16"]),
    ("malformed_set", ["--set", "hidden_size"], ["--set='hidden_size'", "section.key=value"]),
    ("hidden_not_multiple_of_heads", sets("model.hidden_size=62"),
     ["model.hidden_size=62", "num_attention_heads=4"]),
    ("deepspeed_owned_batch_size", sets("deepspeed.train_batch_size=64"),
     ["deepspeed.train_batch_size=64", "set training.global_batch_size instead"]),
    ("deepspeed_owned_zero_stage", sets("deepspeed.zero_optimization.stage=2"),
     ["deepspeed.zero_optimization.stage=2", "set parallel.zero_stage instead"]),
    ("deepspeed_owned_precision", sets("deepspeed.bf16={enabled: true}"),
     ["deepspeed.bf16=", "set training.precision instead"]),
    ("deepspeed_unknown_key", sets("deepspeed.zero_optimization.overlap_com=true"),
     ["deepspeed.zero_optimization.overlap_com=True", "overlap_comm", "fix its spelling"]),
    ("deepspeed_bad_bucket", sets("deepspeed.zero_optimization.reduce_bucket_size=big"),
     ["deepspeed.zero_optimization.reduce_bucket_size='big'", "a whole number"]),
]

WORLD_2 = [
    ("heads_not_divisible_by_tp", sets("model.hidden_size=48", "model.num_attention_heads=3",
                                       "parallel.tensor_parallel_size=2"),
     ["model.num_attention_heads=3", "tensor_parallel_size=2"]),
    ("kv_heads_not_divisible_by_tp", sets("model.num_query_groups=1",
                                          "parallel.tensor_parallel_size=2"),
     ["model.num_query_groups=1", "tensor_parallel_size=2"]),
    ("seq_not_divisible_by_tp_with_sp", sets("model.seq_length=63",
                                             "parallel.tensor_parallel_size=2",
                                             "parallel.sequence_parallel=true"),
     ["model.seq_length=63", "sequence parallelism"]),
    ("zero2_with_pp", sets("parallel.pipeline_parallel_size=2", "parallel.zero_stage=2"),
     ["parallel.zero_stage=2", "pipeline"]),
    ("zero3_with_pp", sets("parallel.pipeline_parallel_size=2", "parallel.zero_stage=3"),
     ["parallel.zero_stage=3", "pipeline"]),
    ("world_2_not_divisible_by_tp4", sets("parallel.tensor_parallel_size=4"),
     ["parallel.tensor_parallel_size=4", "divide the world size 2"]),
    ("global_batch_not_multiple_of_micro_x_dp2", sets("training.global_batch_size=6",
                                                      "training.micro_batch_size=2"),
     ["training.global_batch_size=6", "(2 x 2 = 4)"]),
    ("overlap_comm_with_pp", sets("parallel.pipeline_parallel_size=2",
                                  "deepspeed.zero_optimization.overlap_comm=true"),
     ["deepspeed.zero_optimization.overlap_comm=True", "pipeline_parallel_size=2"]),
]


@pytest.mark.parametrize("args, fragments", [c[1:] for c in WORLD_1], ids=[c[0] for c in WORLD_1])
def test_single_process_config_errors(args, fragments):
    proc = run_cli(["--config", TINY] + args, clean_env())
    assert_clean_error(proc, *fragments)
    assert proc.returncode == 2


@pytest.mark.parametrize("args, fragments", [c[1:] for c in WORLD_2], ids=[c[0] for c in WORLD_2])
def test_two_rank_layout_errors_stop_before_rendezvous(args, fragments):
    env = clean_env(RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(free_port()))
    proc = run_cli(["--config", TINY] + args, env)
    assert_clean_error(proc, *fragments)
    assert proc.returncode == 2


def test_yaml_unknown_key_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  num_layers: 2\n  hidden_sise: 64\n")
    assert_clean_error(run_cli(["--config", str(bad)], clean_env()),
                       "model.hidden_sise=64", "known key", "remove it or fix its spelling")
    missing = str(tmp_path / "nope.yaml")
    assert_clean_error(run_cli(["--config", missing], clean_env()),
                       f"config file {missing!r} does not exist")
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [\n")
    assert_clean_error(run_cli(["--config", str(broken)], clean_env()), "not valid YAML")


def test_yaml_deepspeed_section_refusal_is_one_line(tmp_path):
    """A key the project owns, in the YAML's deepspeed section: exit 2 and a single line that
    names the key and the project's own setting."""
    bad = tmp_path / "ds.yaml"
    bad.write_text(open(TINY).read() + "deepspeed:\n  gradient_clipping: 0.5\n")
    proc = run_cli(["--config", str(bad)], clean_env())
    assert_clean_error(proc, "deepspeed.gradient_clipping=0.5", "set training.clip_grad instead")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_runs_config_yaml_used_from_another_folder_is_refused(tmp_path):
    """A resume with a run's own config.yaml (run.dir relative to where the run started) from
    another folder (the repository here): refused before anything is written, not a fresh
    start in <cwd>/runs/... (training/run_paths.check_own_config)."""
    import os
    from megatron.config import load_config
    from tests.support.paths import ROOT
    name = f"runs/own-config-{os.getpid()}"
    run = tmp_path / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(load_config(TINY, [f"run.dir={name}"]).to_yaml())
    proc = run_cli(["--config", str(run / "config.yaml"), *sets("checkpoint.load=auto")],
                   clean_env())
    assert_clean_error(proc, f"is the config.yaml of the run in {run}, but its run.dir="
                             f"'{name}' names another folder", f"--set run.dir={run};")
    assert proc.returncode == 2 and not os.path.exists(os.path.join(ROOT, name))


def test_bad_launcher_environment_is_one_message():
    env = clean_env(RANK="0", WORLD_SIZE="two")
    assert_clean_error(run_cli(["--config", TINY], env), "WORLD_SIZE='two'")


@pytest.mark.slow
def test_real_torchrun_two_ranks(tmp_path):
    """The ranks print the message and exit 2; torchrun fails. Only the ranks' stderr is read
    (torchrun prints its own agent traceback), and a rank may be empty: torchrun terminates the
    other rank as soon as the first one exits."""
    # --standalone: the rendezvous port is the one the OS hands out when torchrun binds it, not a
    # port probed beforehand that another process can take in between (seen once under load).
    cmd = [*torchrun_cmd(2), "--log-dir", str(tmp_path), "--redirects", "3"]
    cmd += train_cmd("--config", TINY, *sets("model.hidden_size=48",
                                            "model.num_attention_heads=3",
                                            "parallel.tensor_parallel_size=2"))
    if ENTRY is None:
        cmd.insert(cmd.index(sys.executable, 1), "--no-python")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=120)
    assert proc.returncode != 0
    logs = sorted(glob.glob(str(tmp_path / "*" / "attempt_0" / "*" / "stderr.log")))
    assert len(logs) == 2, proc.stderr[-3000:]
    texts = [open(path).read() for path in logs]
    assert any("model.num_attention_heads=3" in t for t in texts), texts
    assert not any("Traceback" in t for t in texts), texts
    assert "exitcode  : 2" in proc.stderr


def test_config_errors_stop_before_torch_is_imported():
    """A mistake in the config costs a fraction of a second: torch is never loaded for it."""
    code = ("import sys\n"
            "from megatron.cli.train import main\n"
            f"code = main(['--config', {TINY!r}, '--set', 'training.global_batch_size=15'])\n"
            "print('exit', code, 'torch' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean_env(), timeout=60)
    assert proc.stdout.strip() == "exit 2 False", proc.stdout + proc.stderr
