"""Weak and strong scaling projections over node counts, as the paper measured them: TP, PP and
the micro-batch stay fixed and DP grows with the nodes. Weak scaling grows the global batch with
DP (constant accumulation steps); strong scaling keeps it, so each replica runs fewer
micro-batches and the pipeline bubble grows."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import List, Optional, Sequence

from megatron.config.errors import InputError
from megatron.planner.layout import Job, Layout, layout_problem
from megatron.planner.memory import GIB, peak_memory
from megatron.planner.profile import Profile
from megatron.planner.ranges import MARGIN
from megatron.planner.timing import step_time


@dataclass(frozen=True)
class ScalingPoint:
    mode: str            # weak | strong
    nodes: int
    gpus: int
    global_batch: int
    layout: Optional[Layout]
    step_s: float
    tflops_per_gpu: float
    tokens_per_s: float
    bubble: float
    efficiency: float
    note: str = ""
    memory_share: float = 0.0  # the busiest stage's reserved memory over the device's


def _layout_at(base: Layout, job: Job, dp: int, mode: str) -> Optional[Layout]:
    if mode == "weak":
        return dataclasses.replace(base, dp=dp)
    per_step = base.micro_batch * dp
    if job.global_batch % per_step:
        return None
    return dataclasses.replace(base, dp=dp, grad_accum=job.global_batch // per_step)


def project(job: Job, base: Layout, prof: Profile, nodes: Sequence[int], mode: str) -> List[ScalingPoint]:
    """One point per node count; efficiency relative to the first (smallest) count."""
    g, model_gpus = prof.spec.gpus_per_node, base.tp * base.pp
    points: List[ScalingPoint] = []
    ref = None
    for n in sorted(nodes):
        gpus = n * g
        if gpus % model_gpus:
            raise InputError(f"{n} node(s) = {gpus} devices is not a multiple of TP x PP = "
                             f"{model_gpus}; pick node counts that are")
        lay = _layout_at(base, job, gpus // model_gpus, mode)
        if lay is None:
            points.append(ScalingPoint(mode, n, gpus, job.global_batch, None, 0, 0, 0, 0, 0,
                                       "global batch not divisible by micro-batch x DP"))
            continue
        scaled = dataclasses.replace(job, global_batch=lay.global_batch)
        problem = layout_problem(scaled, lay, prof.spec.framework)
        est = step_time(scaled, lay, prof)
        mem = peak_memory(scaled, lay, prof.constants, framework=prof.spec.framework)
        share = mem.reserved_bytes / (prof.spec.gpu_memory_gb * GIB)
        note = problem or ("exceeds device memory" if share > 1 else
                           f"{100 * share:.0f}% of device memory" if share >= MARGIN else "")
        if ref is None:
            ref = (est, gpus)
        if mode == "weak":
            eff = est.tflops_per_gpu / ref[0].tflops_per_gpu
        else:
            eff = ref[0].step_s * ref[1] / (est.step_s * gpus)
        points.append(ScalingPoint(mode, n, gpus, lay.global_batch, lay, est.step_s,
                                   est.tflops_per_gpu, est.tokens_per_s, est.bubble, eff, note,
                                   share))
    return points


HEADER = ("mode", "nodes", "GPUs", "global batch", "layout", "step s", "TFLOPs/GPU", "tokens/s",
          "bubble %", "efficiency %", "note")


def table_rows(points: List[ScalingPoint]) -> List[List[str]]:
    return [[p.mode, str(p.nodes), str(p.gpus), str(p.global_batch),
             p.layout.key() if p.layout else "-", f"{p.step_s:.3g}", f"{p.tflops_per_gpu:.1f}",
             f"{p.tokens_per_s:.4g}", f"{100 * p.bubble:.1f}", f"{100 * p.efficiency:.1f}", p.note]
            for p in points]


def plot(points: List[ScalingPoint], path: str, title: str) -> None:
    """Efficiency and TFLOPs per GPU against the device count, one line per mode."""
    try:
        import matplotlib
    except ImportError:
        raise InputError("a plot needs matplotlib: pip install 'megatron-frontier[plan]' "
                         "(or leave out --plot)") from None
    matplotlib.use("Agg")  # files only: no display on compute or CI machines
    import matplotlib.pyplot as plt

    fig, (ax_eff, ax_tf) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, marker in (("weak", "o"), ("strong", "s")):
        pts = [p for p in points if p.mode == mode and p.layout is not None]
        if not pts:
            continue
        gpus = [p.gpus for p in pts]
        ax_eff.plot(gpus, [100 * p.efficiency for p in pts], marker=marker, label=f"{mode} scaling")
        ax_tf.plot(gpus, [p.tflops_per_gpu for p in pts], marker=marker, label=mode)
    for ax in (ax_eff, ax_tf):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs")
        ax.grid(True, alpha=0.3)
        ax.legend()
    ax_eff.axhline(100, color="grey", linestyle="--", linewidth=1)
    ax_eff.set_ylabel("scaling efficiency (%)")
    ax_eff.set_ylim(0, 110)
    ax_tf.set_ylabel("predicted TFLOPs per GPU")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
