"""megatron-convert: merging a TP2 x PP2 checkpoint (GPT-2 and Llama flavours) and a TP1/PP1 one
into one unsharded model, and clear errors.

One 4-rank job (convert_worker.py, in the 4-rank launch shared with the equivalence modules:
tests/support/launch_batches.py) trains each run for 2 steps, saves it and records the
validation loss its own engine computed on one fixed global batch with the saved weights. A
failure of the loss check with the key/shape check passing localizes to the order in which
shards are concatenated (QKV groups, the SwiGLU [gate; up] stride, row- vs column-parallel dims);
a key/shape failure localizes to the pipeline-layer naming or the TP partition table."""
import os
import subprocess
import sys

import pytest
import torch

from megatron.cli.convert import main as convert_main
from megatron.config import load_config
from megatron.data import build_iterators
from megatron.model import build_model
from megatron.parallel.state import ParallelState
from megatron.checkpoint.convert import build_single_model, load_single, merge_run, single_config
from megatron.checkpoint.state import Partition
from megatron.checkpoint.export import load_run
from tests.support.launch_batches import TIMEOUT_S
from tests.support.paths import ROOT, TINY

WORKER = os.path.join(ROOT, "tests", "support", "convert_worker.py")
RUNS = ["tp2pp2-gpt2", "tp2pp2-llama", "single-gpt2"]
LLAMA = ["model.position_embedding_type=rotary", "model.normalization=rmsnorm",
         "model.activation=swiglu", "model.num_query_groups=2", "model.add_bias_linear=false",
         "model.tie_embeddings=false"]
# The run's tokenizer vocabulary and the rows its TP layout pads it to (data/vocab.py).
VOCAB = {"tp2pp2-gpt2": (512, 512), "tp2pp2-llama": (600, 768), "single-gpt2": (512, 512)}
TOLERANCE = 1e-5
BIN = os.path.dirname(sys.executable)


def launches(tmp):
    """The one 4-rank job, in the 4-rank launch shared with the equivalence modules
    (tests/support/launch_batches.py)."""
    return [(4, WORKER, ["--workdir", tmp])]


@pytest.fixture(scope="module")
def runs(shared_launches):
    return shared_launches.results(__name__)


def fixed_batch_loss(model, run_cfg) -> float:
    """Mean loss over the first global batch of the validation stream, the batch the worker's
    engine evaluated (equal-sized micro-batches, so the mean of means is the overall mean)."""
    t = run_cfg.training
    it = build_iterators(run_cfg, 0, 1).valid()
    model.eval()
    with torch.no_grad():
        losses = [model(*next(it)).item() for _ in range(t.global_batch_size // t.micro_batch_size)]
    return sum(losses) / len(losses)


@pytest.mark.parametrize("flavour", [[], LLAMA], ids=["gpt2", "llama"])
def test_every_parameter_carries_its_partition(flavour):
    """Set where the layers create them: the checkpoint code reads nothing else."""
    cfg = load_config(TINY, flavour + ["parallel.tensor_parallel_size=2"])
    model = build_model(cfg, ParallelState(tp=2, rank=0), 512)
    parts = {name: Partition.of(p) for name, p in model.named_parameters()}
    swiglu = cfg.model.activation == "swiglu"
    for name, part in parts.items():
        if ".mlp.fc1." in name:
            assert (part.dim, part.stride) == (0, 2 if swiglu else 1), name
        elif name.endswith((".attention.dense.weight", ".mlp.fc2.weight")):
            assert part.dim == 1, name
        elif name.endswith(("word_embeddings.weight", "output.head.weight")):
            assert (part.dim, part.vocab) == (0, True), name
        elif ".attention.qkv." in name:
            assert (part.dim, part.stride) == (0, 1), name
        else:
            assert part.dim is None, name


def test_missing_run_dir_is_a_clear_error(tmp_path):
    missing = str(tmp_path / "no-such-run")
    proc = subprocess.run([os.path.join(BIN, "megatron-convert"), "to-single", "--run-dir",
                           missing, "--output", str(tmp_path / "out.pt")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode != 0
    assert missing in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_run_without_checkpoint_is_a_clear_error(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(load_config(TINY).to_yaml())
    code = convert_main(["to-single", "--run-dir", str(run), "--output", str(tmp_path / "o.pt")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("megatron-convert: error: "), err
    assert str(run / "checkpoints") in err and "no complete checkpoint" in err, err


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("name", RUNS)
def test_merged_keys_and_shapes_match_unsharded_model(runs, name, tmp_path):
    out = str(tmp_path / f"{name}.pt")
    assert convert_main(["to-single", "--run-dir", runs[name]["run_dir"], "--output", out]) == 0
    merged = load_single(out)
    vocab, rows = VOCAB[name]
    assert (merged.vocab_size, merged.padded_vocab_size) == (vocab, rows)
    cfg = single_config(load_config(os.path.join(runs[name]["run_dir"], "config.yaml")))
    reference = build_model(cfg, ParallelState.single(), rows).state_dict()
    got = {k: tuple(v.shape) for k, v in merged.state_dict.items()}
    assert got == {k: tuple(v.shape) for k, v in reference.items()}


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("name", RUNS)
def test_merged_loss_matches_sharded_eval(runs, name):
    # Through load_run, the reader megatron-generate uses.
    run_dir = runs[name]["run_dir"]
    _, model = load_run(run_dir)
    got = fixed_batch_loss(model, load_config(os.path.join(run_dir, "config.yaml")))
    want = runs[name]["valid_loss"]
    assert abs(got - want) / abs(want) <= TOLERANCE, f"{name}: merged {got} vs sharded {want}"


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_merged_weights_match_single_process_run(runs):
    # Same config, same data: the layouts train to the same weights up to reduction order
    # (measured 2.5e-6); a misplaced shard is off by the init scale (0.02).
    sharded = merge_run(runs["tp2pp2-gpt2"]["run_dir"]).state_dict
    single = merge_run(runs["single-gpt2"]["run_dir"]).state_dict
    for name, tensor in single.items():
        worst = (sharded[name] - tensor).abs().max().item()
        assert worst <= 1e-4, f"{name} differs by {worst}"


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
def test_trim_vocab_keeps_real_token_logits(runs):
    run_dir = runs["tp2pp2-llama"]["run_dir"]
    kept, trimmed = merge_run(run_dir), merge_run(run_dir, trim_vocab=True)
    assert trimmed.padded_vocab_size == 600
    tokens = torch.arange(64).remainder(600).view(1, 64) * 7 % 600
    with torch.no_grad():
        a = build_single_model(kept).eval()(tokens)[..., :600]
        b = build_single_model(trimmed).eval()(tokens)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("name", ["tp2pp2-gpt2", "tp2pp2-llama"])
def test_to_hf_from_a_sharded_run_reproduces_the_merged_logits(runs, name, tmp_path):
    """megatron-convert to-hf on a TP2 x PP2 run: transformers loads the folder and gives the
    merged model's logits (GPT-2 and Llama with grouped keys/values)."""
    transformers = pytest.importorskip("transformers")
    run_dir, out = runs[name]["run_dir"], str(tmp_path / "hf")
    assert convert_main(["to-hf", "--run-dir", run_dir, "--output-dir", out]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    merged = build_single_model(merge_run(run_dir)).eval()
    tokens = (torch.arange(128).view(2, 64) * 7) % 500  # real ids of both vocabularies
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, merged(tokens).transpose(0, 1),
                                   rtol=1e-4, atol=1e-4)
