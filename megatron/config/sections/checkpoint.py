"""The checkpoint section: when checkpoints are written, where, how many are kept, and what a
run starts from (a checkpoint, or a single-file model); read by training/checkpointer.py,
training/startup.py, checkpoint/ and the job chain."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from megatron.config.errors import ConfigError
from megatron.config.sections.checks import finite, positive, written_out


@dataclass
class CheckpointConfig:
    save: bool = False
    """Write a checkpoint into <run.dir>/checkpoints at the end of training (training.train_iters;
    the job chain needs it). save_interval and save_interval_minutes save on their own, and a
    stop signal, training.exit_interval or the job's deadline saves even without it."""
    save_interval: int = 0
    """Save after every step that is a multiple of this, with or without checkpoint.save; 0:
    no periodic saves by steps."""
    save_interval_minutes: float = 0.0
    """Also save when this many minutes of wall clock have passed since the last save (0: never);
    rank 0's clock decides and every rank follows, so all ranks save at the same step."""
    keep_last: int = 0
    """Keep the newest N complete checkpoints; older ones are removed only after a newer one is
    committed (0: keep all). Incomplete ones are never removed."""
    async_save: bool = False
    """Asynchronous checkpoints (training/checkpointer.py): each rank copies its pieces into host
    memory and training goes on while a writer streams and fsyncs them; the commit protocol is
    unchanged."""
    save_local_dir: Optional[str] = None
    """A node-local first tier, an absolute path (on Frontier /mnt/bb/<user> with #SBATCH -C nvme:
    --set checkpoint.save_local_dir=/mnt/bb/$USER, which the shell expands; a config does not):
    each rank writes there first, then the checkpoint is drained into <run.dir>/checkpoints and
    committed there. null: write into run.dir directly."""
    load: Optional[str] = None
    """What to resume from. auto: the newest complete checkpoint in <run.dir>/checkpoints (a
    fresh start when there is none), in whatever layout it was written; or a checkpoints folder,
    or one checkpoint folder (step_N). null: start fresh. A run may not start below a complete
    checkpoint of its own <run.dir>/checkpoints (auto would later resume that one before this
    run's saves): a fresh start or an older checkpoint there is refused, naming it, unless
    checkpoint.roll_back=true."""
    roll_back: bool = False
    """true: a run that starts below complete checkpoints of its own <run.dir>/checkpoints
    (checkpoint.load naming an older one of them, a rollback past a loss spike; another run's
    checkpoint; or a fresh start) first moves every checkpoint above its start there into
    <run.dir>/rolled_back/<UTC time>-above-step_N/ (nothing is deleted), instead of being
    refused; its saves and checkpoint.load=auto then continue from its start. Nothing to do
    under checkpoint.load=auto, which continues the newest (a chain's later jobs). The run's
    config.yaml records it as done (false)."""
    new_data_stream: bool = False
    """A resume refuses a checkpoint whose sample stream (model.seq_length, the data section's
    corpus, split, tokenizer and seed) differs from this run's. true: resume weights, optimizer and
    step anyway, and start the new stream at its first sample."""
    keep_data_position: bool = False
    """true: resume on another sample stream at the checkpoint's position (consumed samples), as
    when a corpus grew or was rebuilt and the samples before the position need not be seen again.
    The same files moved elsewhere need neither setting (they are known by content)."""
    init_from: Optional[str] = None
    """A single-file model (megatron-convert to-single) to start from when no checkpoint is
    resumed: weights only, in any layout; optimizer, step and data position start fresh."""

    def __post_init__(self):
        s = "checkpoint"
        finite(s, self)
        if self.new_data_stream and self.keep_data_position:
            raise ConfigError("checkpoint.keep_data_position", True, "false with "
                              "checkpoint.new_data_stream=true (start the new stream afresh, or "
                              "keep the position: one of the two)", "unset one of them")
        positive(s, "save_interval", self.save_interval, allow_zero=True)
        positive(s, "keep_last", self.keep_last, allow_zero=True)
        if self.save_interval_minutes < 0:
            raise ConfigError("checkpoint.save_interval_minutes", self.save_interval_minutes,
                              "a number of minutes >= 0", "use 0 to save by steps only")
        for name in ("save_local_dir", "load", "init_from"):
            written_out(s, name, getattr(self, name))
        for name in ("async_save", "roll_back"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"checkpoint.{name}", getattr(self, name), "true or false")
        if self.save_local_dir is not None and not (
                isinstance(self.save_local_dir, str) and self.save_local_dir.startswith("/")):
            raise ConfigError("checkpoint.save_local_dir", self.save_local_dir,
                              "an absolute path on node-local storage (on Frontier /mnt/bb/$USER "
                              "with #SBATCH -C nvme)", "or leave it unset (null) to write "
                              "checkpoints into run.dir directly")
