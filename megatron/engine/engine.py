"""Imports deepspeed (with the Muon stand-ins below) and builds the DeepSpeed engine (plain for
PP=1, the PipelineEngine for PP>1) around our model, with a torch optimizer and our LR schedule,
and exposes a small interface to the loop: train_step, eval_step, and the training state for
checkpoints (state.py says where DeepSpeed keeps it; model.py how DeepSpeed sees the model).

No run-time compilation: DeepSpeed's own Adam and its CPU shared-memory collective op would both
JIT-compile C++ at run time, so we hand DeepSpeed a torch AdamW and switch the shm op off."""
from __future__ import annotations

import importlib
import logging
import sys
import types
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional

import torch
import torch.distributed as dist

from megatron.checkpoint.state import RankState
from megatron.engine import state as engine_state
from megatron.engine.deepspeed_json import deepspeed_config
from megatron.engine.model import mark_tensor_parallel, pipeline_module
from megatron.engine.mpu import DeepSpeedMPU
from megatron.engine.optimizer import WarmupDecayLR, build_optimizer
from megatron.model import GPTModel, build_context, pipeline_layers
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


@dataclass
class StepResult:
    loss: float
    grad_norm: Optional[float]
    lr: float
    loss_scale: Optional[float]
    skipped: bool


class Engine:
    def __init__(self, cfg, state: ParallelState, vocab_size: int, device: torch.device,
                 dp_size: int, init_text_vocab: Optional[int] = None, startup=None):
        """init_text_vocab: set to the tokenizer's vocabulary to copy training.init_from into
        the model before DeepSpeed wraps it (None: keep the seeded initialisation).
        startup: a launch.startup.StartupTimer that gets a mark per phase, or None."""
        mark = startup.mark if startup is not None else (lambda name: None)
        deepspeed = _import_deepspeed()
        deepspeed.init_distributed(dist_backend=dist.get_backend(), auto_mpi_discovery=False)
        mark("deepspeed import")
        self.cfg, self.state, self.device = cfg, state, device
        self.pipeline = state.pp > 1
        self.ds_config = deepspeed_config(cfg, dp_size, device.type)
        self.gas = self.ds_config["gradient_accumulation_steps"]
        ctx = build_context(cfg, state, vocab_size, device)
        self.backend, self.tracker = ctx.backend, ctx.tracker
        # Each pipeline layer's GPTModel name prefix (PP=1: the GPTModel names its own).
        self._prefixes = []
        if self.pipeline:
            layers = pipeline_layers(cfg.model, ctx)
            self._prefixes = [layer.name for layer in layers]
            # DeepSpeed broadcasts the tied embedding in place while building the module (and
            # again when loading): under no_grad that copy stays out of the autograd graph.
            with torch.no_grad():
                model = pipeline_module(layers, cfg.parallel.pipeline_partition_method, state)
        else:
            model = GPTModel(cfg.model, ctx)
        mark_tensor_parallel(model)
        self.module = model
        mark("model build")
        if init_text_vocab is not None:
            from megatron.checkpoint.init_from import load_initial_weights
            load_initial_weights(self.named_parameters(), cfg, state, vocab_size,
                                 init_text_vocab)
            mark("init_from")
        self.optimizer = build_optimizer(model, cfg.optimizer, device)
        self.scheduler = WarmupDecayLR(self.optimizer, cfg.optimizer, cfg.training.train_iters)
        mark("optimizer")
        kwargs = {} if self.pipeline else {"mpu": DeepSpeedMPU(state)}
        self.engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=self.optimizer, lr_scheduler=self.scheduler,
            config=self.ds_config, dist_init_required=False, **kwargs)
        if dp_size == 1 and cfg.parallel.zero_stage == 0:
            # Averaging gradients over a data-parallel group of one rank changes nothing, but
            # DeepSpeed still copies them all into one flat buffer, all-reduces it and copies
            # them back: 2% of a step of issue 15's model. (ZeRO's reductions also fill the
            # optimizer's own buffers, so they stay.)
            self.engine.enable_backward_allreduce = False
            self.engine.pipeline_enable_backward_allreduce = False
        mark("deepspeed initialize")

    def parameters_on_rank(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def _batch(self, it: Iterator):
        tokens, labels = next(it)
        return tokens.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)

    def _mean_over_dp(self, value: torch.Tensor) -> float:
        if self.state.dp > 1:
            dist.all_reduce(value, group=self.state.dp_group)
            value = value / self.state.dp
        return value.item()

    def train_step(self, it: Iterator) -> StepResult:
        self.engine.train()
        skipped_before = self.engine.skipped_steps
        lr = self.scheduler.get_last_lr()[0]
        if self.pipeline:
            loss = float(self.engine.train_batch(data_iter=it))
        else:
            total = torch.zeros((), device=self.device)
            for _ in range(self.gas):
                out = self.engine(*self._batch(it))
                self.engine.backward(out)
                self.engine.step()
                total += out.detach().float()
            loss = self._mean_over_dp(total / self.gas)
        norm = self.engine.get_global_grad_norm()
        norm = None if norm is None else float(norm)
        return StepResult(loss, norm, lr, self._loss_scale(),
                          self.engine.skipped_steps > skipped_before)

    def _loss_scale(self) -> Optional[float]:
        if self.cfg.training.precision != "fp16":
            return None
        opt = self.engine.optimizer
        scale = getattr(opt, "cur_scale", None) or getattr(opt, "loss_scale", None)
        return float(scale) if scale is not None else None

    @torch.no_grad()
    def eval_step(self, it: Iterator) -> float:
        self.engine.eval()
        if self.pipeline:
            return float(self.engine.eval_batch(data_iter=it, num_micro_batches=self.gas))
        total = torch.zeros((), device=self.device)
        for _ in range(self.gas):
            total += self.engine(*self._batch(it)).float()
        return self._mean_over_dp(total / self.gas)

    def named_parameters(self):
        """This rank's parameters under their GPTModel (TP=1, PP=1) names."""
        return list(engine_state.global_named_parameters(self.module, self._prefixes))

    def checkpoint_state(self, rng: Optional[dict]) -> RankState:
        """What this rank owns of the training state, as the checkpoint code reads and fills it."""
        coords = (self.state.tp_rank, self.state.pp_rank, self.state.dp_rank)
        return engine_state.rank_state(self.engine, self.named_parameters(), coords, rng)

    def checkpoint_meta(self) -> Dict[str, Any]:
        """The schedule, Adam's step and DeepSpeed's counters (the same on every rank)."""
        return {"scheduler": self.scheduler.state_dict(),
                "adam_step": engine_state.adam_step(self.engine),
                "engine": engine_state.counters(self.engine)}

    def restore_meta(self, meta: Dict[str, Any]) -> None:
        """After checkpoint.sharded.load has filled the tensors: the rest of checkpoint_meta."""
        self.scheduler.load_state_dict(meta["scheduler"])
        engine_state.set_adam_step(self.engine, int(meta["adam_step"]))
        engine_state.set_counters(self.engine, meta.get("engine", {}))
