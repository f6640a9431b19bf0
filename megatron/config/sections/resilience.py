"""The resilience section: the components that notice a run going wrong and end it or route
around it: the node check, the divergence guard (training/health.py, divergence.py), silent
data error re-runs (sdc.py), the training state's invariants (state_check.py), the hang
watchdog (watchdog.py) and the straggler check (stragglers.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from megatron.config.errors import ConfigError
from megatron.config.sections.checks import check_choices, finite, positive


@dataclass
class ResilienceConfig:
    check_node: bool = True
    """Each rank checks its node before joining the job (launch/health.py: GPUs visible, a GEMM
    against its float64 reference, free memory, MEGATRON_HEALTH_CHECK); a failing node ends the
    job at once (exit 5) and the job chain leaves it out of the next job."""
    max_skipped_steps: int = 5
    """Divergence guard: a non-finite loss always stops the run, with no checkpoint of the
    diverged state; so do more consecutive steps skipped for non-finite gradients (fp32, bf16)
    than this."""
    max_loss_scale_skips: int = 50
    """Like max_skipped_steps, for fp16 loss-scale overflows (normal in bursts)."""
    loss_spike_factor: float = 0.0
    """A loss above loss_spike_factor x the median of the last loss_spike_window losses is a
    spike; 0: not checked, else a factor above 1."""
    loss_spike_window: int = 50
    """Losses the spike check's running median is taken over."""
    loss_spike_action: Literal["log", "stop", "rollback"] = "log"
    """What a spike does: log it; stop the run; or roll back to the newest checkpoint and go on
    past the batches that caused it (at most max_rollbacks times in one run)."""
    max_rollbacks: int = 3
    """Rollbacks allowed in one run before a spike stops it."""
    rerun_suspect_steps: bool = False
    """Silent data errors told apart from spikes (training/sdc.py): when the divergence guard
    sees a spike or a non-finite loss, the step's batch is computed again without an update and
    compared on each rank; a rank whose result differs is named ({"event": "sdc_suspect"}), an
    identical result is a real spike and the guard's policy applies. Not with pipeline
    parallelism. Needs loss_spike_factor above 1: a spike is what it re-runs (with 0 only a
    non-finite loss would be, and a wrong but finite one would pass unseen), so true with
    loss_spike_factor 0 is refused."""
    check_state: bool = True
    """After every update each rank checks cheap invariants of the training state
    (training/state_check.py): its AdamW moments obey m^2 <= C v (a bound any gradients keep),
    and its weights' checksum equals its data-parallel replicas' (ZeRO 0-2). A rank that breaks
    one is named ({"event": "state_suspect"}, its node in bad_nodes) and the run stops with
    exit 5 before anything of the step is saved. One pass over the optimizer state and weights
    and one small all-gather per step (benchmarks/trainer/bench_state_check.py)."""
    startup_timeout_minutes: float = 30.0
    """The hang watchdog (training/watchdog.py): a rank whose step, agreement, evaluation, save or
    load runs past its limit dumps every thread's stack into <run.dir>/hangs/, writes a hang event
    and exits 4, so srun (--kill-on-bad-exit) or torchrun ends the job. This is the limit until
    the first step is done (rendezvous, model, first step); 0: off."""
    hang_timeout_minutes: float = 5.0
    """The watchdog's limit after the first step: the larger of this and 5x the slowest such
    phase measured; for a save, from the first on, the larger of this and 5x what a save costs
    (the slowest of the last saves, start to commit, background write included; before any,
    the estimate from the storage probed at start-up); 0: off."""
    straggler_interval: int = 50
    """Every this many steps the ranks compare their median forward pass (0: never)."""
    straggler_factor: float = 1.2
    """A rank above straggler_factor x the others' median in two windows in a row is named in a
    warning and a straggler event; a factor above 1."""

    def __post_init__(self):
        s = "resilience"
        finite(s, self)
        for name in ("startup_timeout_minutes", "hang_timeout_minutes", "straggler_interval",
                     "max_skipped_steps", "max_loss_scale_skips", "max_rollbacks"):
            positive(s, name, getattr(self, name), allow_zero=True)
        if self.straggler_factor <= 1.0:
            raise ConfigError("resilience.straggler_factor", self.straggler_factor,
                              "a factor above 1", "e.g. 1.2: 20% slower than the median rank")
        positive(s, "loss_spike_window", self.loss_spike_window)
        check_choices(s, self)
        if self.loss_spike_factor and self.loss_spike_factor <= 1.0:
            raise ConfigError("resilience.loss_spike_factor", self.loss_spike_factor,
                              "0 (off) or a factor above 1", "e.g. 3.0: a loss three times its "
                              "running median")
        if self.rerun_suspect_steps is True and not self.loss_spike_factor:
            raise ConfigError(
                "resilience.loss_spike_factor", self.loss_spike_factor, "a factor above 1 "
                "with resilience.rerun_suspect_steps=true: the re-run looks only at losses the "
                "divergence guard calls suspect, and with the factor 0 only a non-finite loss "
                "is one, so a silent data error that leaves the loss finite passes unseen",
                "set resilience.loss_spike_factor (e.g. 3.0: a loss three times its running "
                "median is re-run; loss_spike_action=log keeps a real spike's effect to a log "
                "line), or resilience.rerun_suspect_steps=false")
