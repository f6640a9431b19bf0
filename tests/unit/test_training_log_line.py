"""The training log's lines for a person: a step line with step/total, elapsed, ETA from the
steps this process has seen, tokens/s, TFLOP/s per GPU, MFU, loss, lr, grad norm and memory in
human units; one line per event. A failure names the field that is missing or wrong."""
import logging

from tests.support.metrics import step_record
from megatron.base.records import (EvalRecord, RollbackEvent, SaveEvent, SpikeEvent,
                                         StopEvent)
from megatron.base.rundir import RunDir
from megatron.training.log_line import LogLines, clock, event_line, human, memory
from megatron.training.metrics import MetricsWriter


def test_step_line_fields_and_eta():
    lines = LogLines(total=1000, started=100.0)
    first = lines.step_line(step_record(10, step_time_s=2.0, tokens_per_sec=123456.0,
                                        tflops_per_gpu=45.25, mfu=0.2362, mem_gb=41.3,
                                        loss=3.45214, lr=2.5e-4, grad_norm=0.8123), now=130.0)
    assert first.startswith("step 10/1000 (1%) | elapsed 0:00:30 | ETA 0:33:00 | ")
    for part in ("123k tok/s", "45.2 TFLOP/s/GPU", "MFU 23.6%", "loss 3.4521", "lr 2.50e-04",
                 "grad norm 0.812", "mem 41.3 GiB"):
        assert part in first, part
    # From the second line on, the ETA is the measured time per step since the first line.
    later = lines.step_line(step_record(20, step_time_s=5.0), now=150.0)
    assert "elapsed 0:00:50 | ETA 0:32:40" in later  # 20 s for 10 steps x 980 steps left
    assert "mem 102 MiB" in LogLines().step_line(step_record(1, mem_gb=0.1))
    assert "MFU n/a" in LogLines().step_line(step_record(1, mfu=None))
    assert "ETA" not in LogLines().step_line(step_record(1))  # no total known


def test_moe_part_only_for_moe_records_and_json_unchanged_for_dense():
    """A MoE step line ends with 'moe aux X load max/mean Y drop Z%' (aux and z-loss summed over
    the layers, the most loaded layer, the mean dropped share); a dense one has no such part and
    its metrics.jsonl object no 'moe' key."""
    import dataclasses
    from megatron.base.records import parse_metrics_line, record_json
    dense = step_record(3)
    assert "moe" not in LogLines().step_line(dense) and "moe" not in record_json(dense)
    layers = [{"aux_loss": 0.01, "z_loss": 0.002, "tokens_per_expert_max": 600.0,
               "tokens_per_expert_mean": 500.0, "dropped_fraction": 0.1},
              {"aux_loss": 0.012, "z_loss": 0.001, "tokens_per_expert_max": 900.0,
               "tokens_per_expert_mean": 500.0, "dropped_fraction": 0.3}]
    moe = dataclasses.replace(dense, moe=layers)
    assert LogLines().step_line(moe).endswith(" | moe aux 0.025 load max/mean 1.80 drop 20.0%")
    assert parse_metrics_line(record_json(moe)) == moe


def test_units():
    assert clock(3 * 86400 + 3661) == "3d 1:01:01" and human(1.5e9) == "1.5G"
    assert memory(0.5) == "512 MiB" and memory(80.0) == "80.0 GiB"


def test_event_lines():
    assert event_line(SaveEvent(100, 8.1, 12.5, 1.54, 0.4, 7.7)) == \
        "save: step 100, 12.5 GB in 8.1 s (1.54 GB/s; the loop waited 0.4 s)"
    assert event_line(StopEvent(70, "deadline")) == "stop: step 70: deadline"
    assert event_line(SpikeEvent(57, "loss 9 > 3 x 2")) == "loss spike: step 57: loss 9 > 3 x 2"
    assert event_line(RollbackEvent(58, 50, "spike")) == "rollback: step 58 -> step 50: spike"
    assert LogLines().line(EvalRecord(10, "valid", 2.0)) == \
        "evaluation: step 10, validation loss 2.0000 (perplexity 7.389)"


def test_writer_logs_each_record_once(tmp_path, caplog):
    writer = MetricsWriter(RunDir(str(tmp_path)), tensorboard=False)
    with caplog.at_level(logging.INFO, logger="megatron.training.metrics"):
        writer.write(step_record(1))
        writer.write(SaveEvent(1, 1.0, 0.5, 0.5))
    writer.close()
    texts = [r.getMessage() for r in caplog.records]
    assert len(texts) == 2 and texts[0].startswith("step 1 | elapsed") and \
        texts[1].startswith("save: step 1")
