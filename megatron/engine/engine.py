"""Imports deepspeed (with the Muon stand-ins below) and wraps the model it is given in the
DeepSpeed engine (plain for PP=1, the PipelineEngine for PP>1), with a torch optimizer and our LR
schedule, and exposes a small interface to the loop: train_step, eval_step, and the training
state for checkpoints (state.py says where DeepSpeed keeps it; model.py how DeepSpeed sees the
model). The model is built before, by whoever trains (training/startup.py).

No run-time compilation: DeepSpeed's own Adam and its CPU shared-memory collective op would both
JIT-compile C++ at run time, so we hand DeepSpeed a torch AdamW and switch the shm op off."""
from __future__ import annotations

import importlib
import logging
import statistics
import sys
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from megatron.base.records import OptimizerRecord
from megatron.checkpoint.state import RankState
from megatron.config import schedules
from megatron.engine import bf16_flat, overflow_check, runners, zero0_norm, zero_norm
from megatron.engine.chunks import ChunkedModule, ChunkMPU
from megatron.engine import experts as engine_experts
from megatron.engine import state as engine_state
from megatron.engine.mpu import DeepSpeedMPU
from megatron.engine.optimizer import WarmupDecayLR, build_optimizer
from megatron.parallel.state import ParallelState

log = logging.getLogger(__name__)


_MUON = "deepspeed.runtime.zero.muon"


class _NotMuon:
    """Stands in for DeepSpeed's Muon optimizer classes: nothing is an instance of it."""


def _muon_update(*args, **kwargs):
    raise RuntimeError("DeepSpeed's Muon update was called, but this project trains with AdamW")


def _stand_in(name: str, **attrs) -> None:
    """Puts a module named `name` holding `attrs` into sys.modules; asking it for any other name
    imports the real module in its place."""
    if name in sys.modules:
        return
    module = types.ModuleType(name)

    def real(attr):
        if attr.startswith("__"):  # the import system probes __path__ and the like
            raise AttributeError(attr)
        if sys.modules.get(name) is module:
            del sys.modules[name]
        return getattr(importlib.import_module(name), attr)

    module.__dict__.update(attrs, __getattr__=real)
    sys.modules[name] = module


def _stand_ins_for_muon() -> None:
    """DeepSpeed's ZeRO and bf16 optimizers import its Muon optimizer to ask whether the optimizer
    they wrap is one, and ZeRO-1/2 import its update function on every step to call it on
    parameters marked use_muon. Importing Muon compiles its kernels with torch.compile, which
    loads torch._inductor: about 1 s per rank here, before the first step. This project always
    hands DeepSpeed a torch AdamW and marks no parameter, so stand-ins give the same answers."""
    _stand_in(f"{_MUON}.original_muon", MuonWithAuxAdam=_NotMuon, muon_update=_muon_update)
    _stand_in(f"{_MUON}.muon_optimizer", MuonWithAuxAdam=_NotMuon)


def _import_deepspeed():
    _stand_ins_for_muon()
    import deepspeed
    import deepspeed.ops
    # Setting the attribute directly also skips DeepSpeed's compatibility probe, which spawns
    # compilers; the shm op is then treated as unavailable and never built.
    if "__compatible_ops__" not in vars(deepspeed.ops):
        deepspeed.ops.__compatible_ops__ = {"deepspeed_shm_comm": False}
    else:
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    return deepspeed


class ComputeTimer:
    """How long this rank's forward passes take (no collective of a data-parallel layout waits
    there): take() gives the median micro-batch forward since the last take(), what names a slow
    rank (training/stragglers.py). The median, not the sum: a throttled GPU slows every forward,
    while a one-off pause (a garbage collection, the OS preempting the process, a page fault
    storm) slows a few and must not name the rank. On a GPU the spans are timed with CUDA events
    read at take(), so no step synchronizes for it."""

    def __init__(self, device: torch.device):
        self.gpu = device.type == "cuda"
        self.spans, self.pending, self._began = [], [], None

    def start(self) -> None:
        if self.gpu:
            self._began = torch.cuda.Event(enable_timing=True)
            self._began.record()
        else:
            self._began = time.perf_counter()

    def stop(self) -> None:
        if self.gpu:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.pending.append((self._began, end))
        else:
            self.spans.append(time.perf_counter() - self._began)

    def take(self) -> float:
        """The median span in seconds since the last take() (0.0 when none), and a new window."""
        if self.pending:
            self.pending[-1][1].synchronize()
            self.spans += [a.elapsed_time(b) / 1e3 for a, b in self.pending]
            self.pending = []
        spans, self.spans = self.spans, []
        return statistics.median(spans) if spans else 0.0


@dataclass
class StepResult:
    loss: float
    grad_norm: Optional[float]
    lr: float
    loss_scale: Optional[float]
    skipped: bool
    # the update was not applied (training/sdc.py), or must not be kept: the training state broke
    # an invariant (training/state_check.py); suspect: the checker that says who and why
    withheld: bool = False
    suspect: Any = None


def join_deepspeed():
    """Imports deepspeed (with the stand-ins above) and hands it our process group; before any
    DeepSpeed object is built (the pipeline module among them). Returns the module."""
    deepspeed = _import_deepspeed()
    deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
    return deepspeed


def _release_deepspeed_globals() -> None:
    """What DeepSpeed's module globals keep of a closed engine's groups: the mpu (our
    ParallelState, every group) until DeepSpeed's own destroy_process_group, which this project
    does not call (launch.leave_distributed calls torch's), the pipeline grid of the p2p module,
    ZeRO-3's stack of modules in forward (a model, holding its ParallelState) and its cache of
    released parameters (_clear_zero3_release_cache). A next run's initialize sets them again."""
    from deepspeed.utils import groups
    release = getattr(groups, "_release_process_group_references", None)
    if release is not None:
        release(None)
    else:  # an older DeepSpeed: the mpu is the reference to our groups
        groups.mpu = None
    p2p = sys.modules.get("deepspeed.runtime.pipe.p2p")
    if p2p is not None and hasattr(p2p, "_grid"):
        p2p._grid = None
    offload = sys.modules.get("deepspeed.runtime.zero.parameter_offload")
    if offload is not None and isinstance(getattr(offload, "FWD_MODULE_STACK", None), list):
        offload.FWD_MODULE_STACK.clear()  # no forward runs once the engine is closed
    _clear_zero3_release_cache()
    _unbind_world_defaults()


def _own_pipe_grid(engine) -> None:
    """DeepSpeed's pipeline sends and receives find their peers through one grid per process
    (deepspeed.runtime.pipe.p2p._grid, the latest built PipelineEngine's): an engine stepping
    while a later job's is alive would send to that job's peers. Each pipeline step points it at
    the engine's own grid first (one attribute compare when it already is)."""
    p2p = sys.modules.get("deepspeed.runtime.pipe.p2p")
    grid = getattr(engine, "grid", None)
    if p2p is not None and grid is not None and getattr(p2p, "_grid", grid) is not grid:
        p2p._grid = grid


def _leave_pipe_grid(engine) -> None:
    """A closing engine's grid out of DeepSpeed's p2p module, if it stepped last there (its
    groups go with it); another engine still alive points it at its own when it steps."""
    p2p = sys.modules.get("deepspeed.runtime.pipe.p2p")
    grid = getattr(engine, "grid", None)
    if p2p is not None and grid is not None and getattr(p2p, "_grid", None) is grid:
        p2p._grid = None


def _drop_graphs(engine) -> None:
    """What a closed engine still holds of autograd graphs: the last micro-batches' outputs and
    loss (a pipeline engine's pipe_buffers, fwd_outputs, loss). Each such tensor holds, through
    the backward hooks DeepSpeed put on it, methods of the engine: a cycle through autograd's
    C++ side that the collector cannot see, which kept a last pipeline stage's engine, model
    and process groups alive until the process ended."""
    def graphed(value) -> bool:
        return isinstance(value, torch.Tensor) and value.grad_fn is not None

    for name, value in list(vars(engine).items()):
        if graphed(value):
            setattr(engine, name, None)
        elif isinstance(value, list) and any(graphed(v) for v in value):
            value.clear()
    for kept in (getattr(engine, "pipe_buffers", None) or {}).values():
        if isinstance(kept, list):
            kept.clear()


def _clear_zero3_release_cache() -> None:
    """ZeRO-3's PartitionedParameterCoordinator caches which parameters each submodule releases
    in an unbounded functools.lru_cache on the method, keyed by (coordinator, submodule, step):
    a class-wide cache that holds every ZeRO-3 run's coordinator, model and (through the
    parameters' ds_process_group) two process groups with their gloo threads until the process
    ends. The cache sits inside DeepSpeed's nvtx wrapper, in its closure."""
    module = sys.modules.get("deepspeed.runtime.zero.partitioned_param_coordinator")
    coordinator = getattr(module, "PartitionedParameterCoordinator", None)
    method = vars(coordinator).get("_PartitionedParameterCoordinator__params_to_release") \
        if coordinator is not None else None
    for fn in (method, *_closure_values(method)):
        if callable(getattr(fn, "cache_clear", None)):
            fn.cache_clear()


def _closure_values(fn) -> list:
    values = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return values


def _unbind_world_defaults() -> None:
    """DeepSpeed's TorchBackend.barrier and monitored_barrier take group=GroupMember.WORLD as a
    default argument, bound when deepspeed.comm.torch was imported, after the join: the world
    group itself, held for the life of the process. Their bodies read None as the world group,
    so None is the same default and holds nothing."""
    from deepspeed.comm.torch import TorchBackend
    for fn in vars(TorchBackend).values():
        for f in (fn, getattr(fn, "__wrapped__", None)):
            defaults = getattr(f, "__defaults__", None)
            if defaults and any(isinstance(d, dist.ProcessGroup) for d in defaults):
                f.__defaults__ = tuple(None if isinstance(d, dist.ProcessGroup) else d
                                       for d in defaults)


class Engine:
    def __init__(self, module: nn.Module, layer_names: List[str], state: ParallelState,
                 device: torch.device, ds_config: Dict[str, Any], optimizer_cfg,
                 training, mark: Optional[Callable[[str], None]] = None,
                 pipeline_schedule: str = schedules.DEFAULT, expert=None):
        """Wraps `module` (a GPTModel, or for PP > 1 the PipelineModule of
        training.startup.build_model) in DeepSpeed with a torch AdamW and our LR schedule.
        layer_names: each pipeline layer's GPTModel name prefix ([] for PP=1). training: the
        training section (the schedule's length and batches).
        ds_config: the generated deepspeed.json (base.deepspeed_json), the one the run files
        also write. mark: called with the name of each phase as it ends (start-up timing).
        pipeline_schedule: parallel.pipeline_schedule (PP > 1), run by the runner its record
        names (runners.py: DeepSpeed's own TrainSchedule, or zero_bubble.py).
        expert: the model's parallel.experts.ExpertParallel (None: a dense model); experts
        split over ranks are reduced over their own group (engine/experts.py)."""
        mark = mark or (lambda name: None)
        deepspeed = _import_deepspeed()
        self.state, self.device, self.module = state, device, module
        self.pipeline = state.pp > 1
        self.ds_config = ds_config
        self.gas = ds_config["gradient_accumulation_steps"]
        self.step_gas = self.gas  # this step's, below gas on a batch-size ramp (set_batch)
        self._explicit_boundary = False
        self.fp16 = ds_config.get("fp16", {}).get("enabled", False)
        self._prefixes = list(layer_names)
        self.compute = ComputeTimer(device)  # forward passes; not measured under PP (DeepSpeed's)
        split = engine_experts.mark_for_deepspeed(module, expert)
        self.optimizer = build_optimizer(module, optimizer_cfg, device)
        self.scheduler = WarmupDecayLR(self.optimizer, optimizer_cfg, training)
        mark("optimizer")
        # DeepSpeed's PipelineEngine takes its groups from the PipelineModule; the plain engine
        # over interleaved chunks gets the groups that engine would have (chunks.ChunkMPU).
        if isinstance(module, ChunkedModule):
            kwargs = {"mpu": ChunkMPU(state)}
        else:
            kwargs = {} if self.pipeline else {"mpu": DeepSpeedMPU(state)}
        with engine_experts.recognised_as_moe(split):
            self.engine, _, _, _ = deepspeed.initialize(
                model=module, optimizer=self.optimizer, lr_scheduler=self.scheduler,
                config=ds_config, dist_init_required=False, **kwargs)
        log.info("DeepSpeed's optimizer: %s", type(self.engine.optimizer).__name__)
        bf16_flat.use_flat_buffers(self.engine.optimizer, state.tp, state.pp)
        overflow_check.use_norm_check(self.engine.optimizer, state.tp, state.pp)
        zero_norm.use_foreach_norm(self.engine.optimizer)
        zero0_norm.mark_gradients(self.engine.optimizer, state.tp)
        zero0_norm.clip_fp32(self.engine, state, expert.edp_size if split else None)
        self.moe_layers = engine_experts.moe_layers(module)
        self.state_check = None  # a training.state_check.StateCheck (resilience.check_state)
        if state.dp_cp == 1 and ds_config["zero_optimization"]["stage"] == 0 and not split:
            # Averaging gradients over a data-parallel group of one rank changes nothing, but
            # DeepSpeed still copies them all into one flat buffer, all-reduces it and copies
            # them back: 2% of a step of issue 15's model. (ZeRO's reductions also fill the
            # optimizer's own buffers, so they stay; and experts under TP reduce over their
            # expert-data-parallel group.)
            self.engine.enable_backward_allreduce = False
            self.engine.pipeline_enable_backward_allreduce = False
        if self.pipeline:
            changed = runners.install(self.engine, module, pipeline_schedule)
            if changed:
                log.info("pipeline schedule %s: %s", pipeline_schedule, changed)
        mark("deepspeed initialize")

    def close(self, release_globals: bool = True) -> None:
        """Unhooks DeepSpeed from the model (DeepSpeedEngine.destroy: ZeRO's hooks on the
        gradient accumulators). Those hooks hold the engine, its optimizer and, through the
        parameters, its process groups in a cycle through C++ objects that Python's collector
        cannot see: left in place, the groups and their gloo threads live until interpreter
        exit, where their teardown raced the process's own (a finished 2-rank run aborting with
        "terminate called without an active exception"). DeepSpeed's module globals hold them
        too (_release_deepspeed_globals), unless another engine is still alive in this process
        (release_globals=False): they are the latest built engine's, and the last close
        releases them."""
        self.engine.destroy()
        _drop_graphs(self.engine)
        if release_globals:
            _release_deepspeed_globals()
        else:
            _leave_pipe_grid(self.engine)

    def parameters_on_rank(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def _batch(self, it: Iterator):
        tokens, labels = next(it)
        return tokens.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    def _mean_over_dp(self, value: torch.Tensor) -> float:
        """The mean over data x context parallel ranks: each context-parallel rank's loss is
        the mean over its equal share of the tokens, so this is the mean over every token."""
        if self.state.dp_cp > 1:
            dist.all_reduce(value, group=self.state.dp_cp_group)
            value = value / self.state.dp_cp
        return value.item()

    def set_batch(self, batch: int) -> None:
        """Makes the next steps take `batch` samples (a batch-size ramp's; a multiple of the
        micro-batch x the data-parallel size, at most the configured global batch). DeepSpeed's
        engine is told (set_train_batch_size), so its loss scaling by the accumulation, the
        pipeline schedules' micro-batch counts and the interleaved executor's follow it; a
        step without a pipeline then marks its accumulation boundary itself, since DeepSpeed
        finds it from a micro-batch count kept over the whole run."""
        per_step = self.ds_config["train_micro_batch_size_per_gpu"] * self.state.dp
        gas = batch // per_step
        if gas * per_step != batch or not 0 < gas <= self.gas:
            raise ValueError(f"a step's global batch of {batch} samples is not whole "
                             f"micro-batches of {per_step} samples up to {self.gas} of them")
        self.scheduler.set_batch(batch)
        if gas == self.step_gas:
            return
        self.engine.set_train_batch_size(self.ds_config["train_batch_size"] // self.gas * gas)
        self.step_gas, self._explicit_boundary = gas, True

    def train_step(self, it: Iterator, check=None, step: int = 0,
                   batch: Optional[int] = None) -> StepResult:
        """One optimizer step over gradient_accumulation_steps micro-batches, or `batch`
        samples' (a batch-size ramp's: set_batch). check: a training.sdc.Rerun for this step
        (resilience.rerun_suspect_steps), which sees the loss before the update and may withhold
        it (StepResult.withheld). step: the step's number, for self.state_check, which verifies
        the state after the update."""
        if batch is not None:
            self.set_batch(batch)
        checker, gas = self.state_check, self.step_gas
        self.engine.train()
        if self.moe_layers:
            engine_experts.set_aux_grad_scale(self.moe_layers, (self._loss_scale() or 1.0)
                                              / gas)
        skipped_before = self.engine.skipped_steps
        lr = self.scheduler.get_last_lr()[0]
        if self.pipeline:
            _own_pipe_grid(self.engine)
        if check is not None:
            loss = self._checked_step(it, check)
            if loss is None:
                if self.moe_layers:  # the update was withheld: so is the bias's
                    engine_experts.update_router_biases(self.moe_layers, self.state, True)
                return StepResult(float("nan"), None, lr, self._loss_scale(), True, True, check)
        elif self.pipeline:
            loss = float(self.engine.train_batch(data_iter=it))
        else:
            total = torch.zeros((), device=self.device)
            for i in range(gas):
                micro = self._batch(it)
                self._boundary(i == gas - 1)
                self.compute.start()
                out = self.engine(*micro)
                self.compute.stop()
                self.engine.backward(out)
                if checker is not None and i == gas - 1:
                    checker.before_update(step)
                self.engine.step()
                total += out.detach().float()
            loss = self._mean_over_dp(total / gas)
        norm = self.engine.get_global_grad_norm()
        norm = None if norm is None else float(norm)
        skipped = self.engine.skipped_steps > skipped_before
        if checker is not None and not skipped and not checker.verify(step):
            return StepResult(loss, norm, lr, self._loss_scale(), skipped, True, checker)
        if self.moe_layers:  # a collective over the stage's ranks, inside the timed step
            engine_experts.update_router_biases(self.moe_layers, self.state, skipped)
        return StepResult(loss, norm, lr, self._loss_scale(), skipped)

    def _checked_step(self, it: Iterator, check) -> Optional[float]:
        """The step with its update held back until check.judge() has seen the loss (PP=1):
        the mean loss, or None when the update was withheld."""
        gas = self.step_gas
        batches = [self._batch(it) for _ in range(gas)]
        check.begin()
        local = []
        for i, batch in enumerate(batches):
            self._boundary(i == gas - 1)
            self.compute.start()
            out = check.corrupt(self.engine(*batch))
            self.compute.stop()
            self.engine.backward(out)
            local.append(out.detach().float())
            if i < gas - 1:
                self.engine.step()  # within the accumulation: no update
        loss = self._mean_over_dp(torch.stack(local).sum() / gas)
        if not check.judge(local, loss, lambda: [self.engine(*b).float() for b in batches]):
            return None
        if self.state_check is not None:
            self.state_check.before_update(check.step)
        self.engine.step()
        return loss

    def _boundary(self, last: bool) -> None:
        """After a batch-size change (set_batch), tells DeepSpeed whether the next micro-batch
        ends the accumulation."""
        if self._explicit_boundary:
            self.engine.set_gradient_accumulation_boundary(last)

    def _loss_scale(self) -> Optional[float]:
        if not self.fp16:
            return None
        opt = self.engine.optimizer
        scale = getattr(opt, "cur_scale", None) or getattr(opt, "loss_scale", None)
        return float(scale) if scale is not None else None

    @torch.no_grad()
    def eval_step(self, it: Iterator) -> float:
        self.engine.eval()
        if self.pipeline:
            _own_pipe_grid(self.engine)
            return float(self.engine.eval_batch(data_iter=it, num_micro_batches=self.gas))
        total = torch.zeros((), device=self.device)
        for _ in range(self.gas):
            total += self.engine(*self._batch(it)).float()
        return self._mean_over_dp(total / self.gas)

    def named_parameters(self):
        """This rank's parameters under their GPTModel (TP=1, PP=1) names."""
        return named_parameters(self.module, self._prefixes)

    def checkpoint_state(self, rng: Optional[dict]) -> RankState:
        """What this rank owns of the training state, as the checkpoint code reads and fills it."""
        rs = engine_state.rank_state(self.engine, self.named_parameters(), self.state.coord, rng)
        rs.params += engine_state.buffer_states(self.module, self.state.coord, self._prefixes)
        return rs

    def checkpoint_meta(self) -> OptimizerRecord:
        """The schedule, Adam's step and DeepSpeed's counters (the same on every rank)."""
        return OptimizerRecord(self.scheduler.state_dict(), engine_state.adam_step(self.engine),
                               engine_state.counters(self.engine))

    def restore_meta(self, meta: OptimizerRecord) -> None:
        """After checkpoint.sharded.load has filled the tensors: the rest of checkpoint_meta."""
        self.scheduler.load_state_dict(meta.scheduler)
        engine_state.set_adam_step(self.engine, meta.adam_step)
        engine_state.set_counters(self.engine, meta.engine)


def named_parameters(module: nn.Module, layer_names: List[str]):
    """A module's parameters under their GPTModel (TP=1, PP=1) names, before or after DeepSpeed
    wrapped it (layer_names as for Engine)."""
    return list(engine_state.global_named_parameters(module, layer_names))
