"""A run's start-up, in the order it happens: where this process sits and on which device, the
checks that must fail on every rank alike before any rendezvous, the process group, the run
directory (its check and lock, and the checkpoint that continues it), the parallel groups, the
model (and checkpoint.init_from), then the engine that wraps it. Each phase gets a mark on the
start-up timer (launch/startup.py), which the first metrics line carries.

Data flows one way: config -> model -> engine; the loop gets a Job and nothing here is read back
from the engine."""
from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from megatron.checkpoint.layout import (Resume, check_continues_newest, check_data,
                                        check_model, data_record, find_resume, layout_record,
                                        roll_back)
from megatron.config import environ
from megatron.base.records import LayoutRecord, RollbackEvent
from megatron.base.rundir import RunDir, RunLock
from megatron.config import Config, ConfigError, validate_for_world
from megatron.config.unused import unread_note
from megatron.config.errors import BadNode
from megatron.config.validate import check_device, grad_accum_error, pipeline_stage_layers
from megatron.data import tokenizer_vocab_size
from megatron.data.tokenizers import eod_id
from megatron.data.vocab import padded_vocab_size
from megatron.base.deepspeed_json import deepspeed_config
from megatron.engine.engine import Engine, join_deepspeed, named_parameters
from megatron.engine.chunks import chunked_module
from megatron.engine.model import mark_tensor_parallel, pipeline_module
from megatron.engine.runners import runner_error
from megatron.launch import detect_device, discover, init_distributed
from megatron.launch.health import check_node, check_node_link, node_name
from megatron.launch.startup import StartupTimer
from megatron.model import GPTModel, ModelContext, build_context, pipeline_layers
from megatron.parallel.agree import rank0_decides
from megatron.parallel.cp_layout import cp_layout_of
from megatron.parallel.state import (ParallelState, dense_grid, destroy_groups_since,
                                     live_groups)
from megatron.training.state_check import StateCheck
from megatron.training.run_paths import check_run_paths

log = logging.getLogger(__name__)


@dataclass
class BuiltModel:
    """The model before an engine wraps it, and the context its modules share (the attention
    backend, the kernels, the dropout random streams)."""
    ctx: ModelContext
    module: nn.Module   # GPTModel (PP=1) or DeepSpeed's PipelineModule of this stage
    layer_names: List[str]  # each pipeline layer's GPTModel name prefix; [] for PP=1

    def named_parameters(self):
        return named_parameters(self.module, self.layer_names)


@dataclass
class Job:
    """What start() sets up for the loop."""
    launch: Any
    device_info: Any
    state: ParallelState
    run: RunDir
    text_vocab: int  # the tokenizer's vocabulary
    vocab: int       # the model's, padded for TP
    layout: LayoutRecord  # written into each checkpoint
    resume: Optional[Resume]  # the checkpoint to continue from, if any
    model: BuiltModel
    ds_config: Dict[str, Any]  # deepspeed.json
    engine: Engine
    lock: Optional[RunLock]  # rank 0's hold on run.dir
    nodes: List[str]  # every rank's node, by rank (Slurm's node name, else the host name)
    started_at: float  # rank 0's Unix time at the rendezvous: names this job alike on all ranks
    groups_before: frozenset = frozenset()  # the names of the process groups alive before it
    rolled_back: Optional[RollbackEvent] = None  # checkpoint.roll_back's, for metrics.jsonl
    frozen_at: int = 0  # its start's freeze (_freeze_older_objects): a later one froze it too

    @property
    def device(self) -> torch.device:
        return self.device_info.device

    @property
    def dp(self) -> int:
        return self.state.dp

    def close(self) -> None:
        """The end of this run's job: the engine lets go of the model (Engine.close), rank 0 of
        run.dir, and every rank of the process groups the job made (parallel/state.py
        destroy_groups_since), whose objects and gloo threads go with the job's engine and
        model, collected now rather than when a later collection finds their cycles. The world's
        group stays for another run (launch.leave_distributed ends it). Jobs alive at once (an
        A/B comparison that steps two engines in turn) close in any order: each keeps the
        groups of the others (_ALIVE) and frees its own objects (_collect_since)."""
        _forget_ended(self.frozen_at)
        try:
            self.engine.close(release_globals=not _ALIVE)
        except Exception as e:  # noqa: BLE001 - never in place of the error that ended the run
            log.warning("closing the engine failed: %s", e)
        finally:
            if self.lock:
                self.lock.release()
            destroy_groups_since(self.groups_before, keep=frozenset().union(*_ALIVE.values()))
            self.engine = self.model = self.state = None  # closed: nothing uses them after
            _collect_since(self.frozen_at)


_FREEZES = [0]  # how many times a job's start froze this process's objects
# The names of the process groups each job still alive made at its start, by its freeze's
# number: a job's close ends the groups created since its start but another's (any order).
_ALIVE: Dict[int, frozenset] = {}


def _forget_ended(closing: int) -> None:
    """The closing job and any job whose groups have all ended without its close (a caller
    that dropped it and destroyed them) leave the jobs still alive (_ALIVE)."""
    _ALIVE.pop(closing, None)
    live = live_groups()
    for key, names in list(_ALIVE.items()):
        if names and not names & live:
            del _ALIVE[key]


def _freeze_older_objects() -> int:
    """What exists before a job (the imports' ~320K objects: torch, DeepSpeed, this package; a
    previous job's survivors in a process that trains several) lives as long as the process:
    frozen out of the collector, a full collection (Job.close's; any the loop triggers) walks
    only the job's objects: 0.18 s -> 0.00 s a collection on the 2-core development machine.
    launch.leave_distributed unfreezes them before the process's last collection. Returns this
    freeze's number, which the job keeps (Job.frozen_at)."""
    gc.freeze()
    _FREEZES[0] += 1
    return _FREEZES[0]


def _collect_since(frozen_at: int) -> None:
    """A closed job's collection. A job started while this one was alive (a notebook keeping
    one run's engine while it starts the next) froze this job's objects too, which a collection
    would then never free: its model, engine and process groups (their gloo threads running on)
    would live until the process ends. Then everything is unfrozen for this one collection
    (~0.2 s, at a close) and frozen again; the jobs still alive count as frozen over in turn."""
    if frozen_at == _FREEZES[0]:
        gc.collect()
        return
    gc.unfreeze()
    gc.collect()
    _freeze_older_objects()


def start(cfg: Config, timer: StartupTimer) -> Job:
    """Joins the job and builds model and engine; `timer` gets a mark per phase."""
    frozen_at = _freeze_older_objects()
    launch = discover()
    device_info = detect_device(launch.local_rank)
    dp = _check_before_joining(cfg, launch.world_size, device_info.device.type, launch.rank)
    if cfg.resilience.check_node:
        _check_node(cfg, launch, device_info.device)
    timer.mark("device")
    text_vocab, vocab = _vocab_sizes(cfg)
    layout = layout_record(cfg, dp, vocab, text_vocab)
    timer.mark("tokenizer")
    nodes, started_at = _join(cfg, launch, device_info, timer)
    groups_before = live_groups()
    run = RunDir(cfg.run.dir)
    lock = _claim(run, launch.rank)
    try:
        resume, rolled_back = _agreed_resume(cfg, layout)
        timer.mark("run directory")
        state = ParallelState.build(cfg.parallel.tensor_parallel_size,
                                    cfg.parallel.pipeline_parallel_size,
                                    timedelta(minutes=cfg.parallel.timeout_minutes),
                                    cp=cfg.parallel.context_parallel_size,
                                    cp_layout=cp_layout_of(cfg.parallel))
        timer.mark("parallel groups")
        ds_config = deepspeed_config(cfg, dp, device_info.device.type)
        model = build_model(cfg, state, vocab, device_info.device, timer)
        _init_from(cfg, model, state, vocab, text_vocab, resume, timer)
        engine = wrap(cfg, model, state, device_info.device, ds_config, timer)
        engine.state_check = StateCheck.of(cfg.resilience, engine, state, nodes, launch.rank)
    except BaseException:
        if lock:
            lock.release()
        destroy_groups_since(groups_before)
        raise
    _ALIVE[frozen_at] = live_groups() - groups_before
    log.info("training %d parameters on rank 0 (tp=%d pp=%d dp=%d, attention=%s)",
             engine.parameters_on_rank(), state.tp, state.pp, dp, model.ctx.backend)
    return Job(launch, device_info, state, run, text_vocab, vocab, layout, resume, model,
               ds_config, engine, lock, nodes, started_at, groups_before, rolled_back, frozen_at)


def _vocab_sizes(cfg: Config) -> Tuple[int, int]:
    """The tokenizer's vocabulary and the model's, padded for TP."""
    text_vocab = tokenizer_vocab_size(cfg)
    return text_vocab, padded_vocab_size(text_vocab, cfg.model.make_vocab_size_divisible_by,
                                         cfg.parallel.tensor_parallel_size)


def _join(cfg: Config, launch, device_info, timer: StartupTimer) -> Tuple[List[str], float]:
    """The process group, the roster, and the node's link check (a collective)."""
    if device_info.is_gpu:
        flight_recorder_env(RunDir(cfg.run.dir), os.environ)
    init_distributed(launch, device_info, timeout_s=60 * cfg.parallel.timeout_minutes)
    nodes, started_at = _roster(launch.world_size)
    timer.mark("process group")
    if cfg.resilience.check_node:
        _refuse_node(cfg, launch, check_node_link(nodes, launch.rank, device_info.device))
        timer.mark("node link check")
    return nodes, started_at


def _roster(world: int) -> Tuple[List[str], float]:
    """Every rank's node and rank 0's clock, gathered once: the watchdog names the nodes of
    ranks that stop answering, the straggler check names slow ones."""
    mine = (node_name(os.environ), time.time())
    every = [mine] if world == 1 else [None] * world
    if world > 1:
        dist.all_gather_object(every, mine)
    return [node for node, _ in every], every[0][1]


# PyTorch's NCCL/RCCL flight recorder: a ring of the last collectives per rank, dumped when the
# process group's own watchdog times out (docs: torch_nccl_environment_variables).
FLIGHT_RECORDER = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


def flight_recorder_env(run: RunDir, environ) -> None:
    """Turns the flight recorder on for a GPU run, dumping into <run.dir>/hangs/ beside the
    hang watchdog's stacks; a value the user set wins."""
    for key, value in FLIGHT_RECORDER.items():
        environ.setdefault(key, value)
    environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
                       os.path.join(run.hangs, "nccl_trace_rank_"))
    try:
        os.makedirs(run.hangs, exist_ok=True)
    except OSError:  # run.dir's own check names the problem, after the rendezvous
        pass


def _check_before_joining(cfg: Config, world: int, device_type: str, rank: int = 0) -> int:
    """A bad layout or input must fail fast on every rank, not leave some ranks waiting in a
    rendezvous. Returns the data-parallel size."""
    dp = validate_for_world(cfg, world)
    check_device(cfg, device_type)
    advice = zero_without_shards(cfg, world, dp)
    if advice and rank == 0:
        log.info(advice)
    if cfg.data.synthetic and rank == 0:
        log.log(logging.WARNING if cfg.data.paths else logging.INFO, "%s", synthetic_note(cfg))
    unread, unknown_vars = unread_note(cfg), environ.unknown_note(os.environ)
    for note in (unread, unknown_vars):
        if note and rank == 0:
            log.warning("%s", note)
    # a schedule the planner prices but no engine runner runs (config/schedules, runners.py)
    unrunnable = runner_error(cfg.parallel.pipeline_schedule)
    if unrunnable is not None:
        raise unrunnable
    if cfg.checkpoint.init_from is not None and not os.path.isfile(cfg.checkpoint.init_from):
        raise ConfigError("checkpoint.init_from", cfg.checkpoint.init_from,
                          "an existing single-file model", "write one with megatron-convert "
                          "to-single --run-dir <run> --output <file>")
    check_run_paths(cfg)  # before the first save finds a folder it cannot write
    return dp


def synthetic_note(cfg: Config) -> str:
    """What a run on data.synthetic=true trains on: said once, and as a warning when data.paths
    is set too (a recipe's placeholder corpus, `--set data.synthetic=true` to measure
    throughput; or a corpus the user meant to train on)."""
    note = (f"data.synthetic=true: training on random token ids (vocabulary "
            f"{cfg.model.vocab_size}), for throughput and tests")
    if cfg.data.paths:
        note += (f"; data.paths ({len(cfg.data.paths)} entr"
                 f"{'y' if len(cfg.data.paths) == 1 else 'ies'}) is not read: set "
                 f"data.synthetic=false to train on it")
    return note


def zero_without_shards(cfg: Config, world: int, dp: int) -> Optional[str]:
    """The start-up note for ZeRO 1-3 over a sharding group of one rank (data parallel x context
    parallel = 1), where ZeRO-0 is allowed too: nothing is sharded, so no memory is saved, but
    DeepSpeed's ZeRO path still flattens, copies and converts every gradient every step. None
    when there is nothing to say."""
    p, zero = cfg.parallel, cfg.parallel.zero_stage
    shards = dense_grid(p.tensor_parallel_size, p.pipeline_parallel_size, dp,
                        p.context_parallel_size).group_size("dp_cp")
    if zero == 0 or shards != 1 or cfg.training.grad_accum_dtype == "fp32":
        return None  # BF16_Optimizer (fp32 accumulation) keeps no ZeRO buckets
    plain = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, zero_stage=0))
    try:
        validate_for_world(plain, world)
    except ConfigError:
        return None  # this layout needs ZeRO (interleaved pipelines, experts): nothing to advise
    return (f"parallel.zero_stage={zero} shards the optimizer over one data-parallel rank: it "
            f"saves no memory, but DeepSpeed's ZeRO path still flattens, copies and converts "
            f"every gradient each step (a 354M-parameter bf16 model on a CPU: 5.2 s a step "
            f"against 3.2 s under ZeRO-0, benchmarks/results/gpu_h200.md; where the host's work "
            f"dominates, the two take about as long, host_overhead_cpu.md there). This layout "
            f"allows parallel.zero_stage=0: set it unless you mean to compare against a sharded "
            f"run" + _fp32_accumulation_advice(cfg))


def _fp32_accumulation_advice(cfg: Config) -> str:
    """Where fp32 gradient accumulation is allowed (grad_accum_error): the faster path still."""
    if grad_accum_error(cfg.training.precision, cfg.parallel.zero_stage,
                        cfg.model.moe.num_experts or 0):
        return ""
    return ("; or keep ZeRO-1 with training.grad_accum_dtype=fp32 (DeepSpeed's BF16_Optimizer, "
            "up to 4 bytes a parameter more): on one H200 a 1.3B model trained at 0.95x the "
            "speed of a plain PyTorch loop that way, 0.87x under ZeRO-0 and 0.85x under ZeRO-1 "
            "(benchmarks/results/gpu_h200.md)")


def _check_node(cfg: Config, launch, device: torch.device) -> None:
    """This rank's node before it joins: a failure is named in <run.dir>/bad_nodes and ends the
    rank with BadNode (exit 5), so the job ends in seconds and the chain leaves the node out."""
    _refuse_node(cfg, launch, check_node(device, launch.ranks_per_node, os.environ))


def _refuse_node(cfg: Config, launch, problems: List[str]) -> None:
    if not problems:
        return
    node, why, run = node_name(os.environ), "; ".join(problems), RunDir(cfg.run.dir)
    try:
        run.add_bad_node(node, why)
        where = f"It is named in {run.bad_nodes}, which the job chain excludes from the next job"
    except OSError as e:  # the node's fault comes first; run.dir's own check names the rest
        where = f"It could not be named in {run.bad_nodes} ({e.strerror})"
    raise BadNode(f"node {node} (rank {launch.rank}) failed its health check: {why}. {where}; "
                  "resilience.check_node=false skips the check")


def _claim(run: RunDir, rank: int) -> Optional[RunLock]:
    """Rank 0 checks run.dir and takes its lock before anything is written there."""
    lock = run.lock() if rank == 0 else None

    def claim():
        run.check()
        lock.acquire()
    rank0_decides(claim)
    return lock


def _agreed_resume(cfg: Config, layout: LayoutRecord
                   ) -> Tuple[Optional[Resume], Optional[RollbackEvent]]:
    """The checkpoint every rank continues from, chosen once by rank 0, and checkpoint.roll_back's
    event when it moved newer checkpoints aside."""
    def choose():
        resume = find_resume(cfg)
        newer = check_continues_newest(cfg, resume)
        if resume is not None:
            check_model(resume, layout)
            new = check_data(resume, data_record(cfg), cfg.checkpoint.new_data_stream,
                             cfg.checkpoint.keep_data_position)
            resume = dataclasses.replace(resume, new_stream=new)
        rolled = None
        if newer is not None:  # checkpoint.roll_back, once the checkpoint is known to fit
            rolled = roll_back(cfg, resume.step if resume is not None else 0, newer)
        return resume, rolled
    return rank0_decides(choose)


def build_model(cfg: Config, state: ParallelState, vocab: int, device: torch.device,
                timer: Optional[StartupTimer] = None) -> BuiltModel:
    """This rank's part of the model: the whole GPTModel for PP=1, else DeepSpeed's pipeline
    module of this stage over model.pipeline_layers (DeepSpeed builds only the local layers),
    or under interleaving (parallel.virtual_pipeline_size > 1) this rank's model chunks."""
    mark = timer.mark if timer is not None else (lambda name: None)
    join_deepspeed()
    mark("deepspeed import")
    # the end-of-document id the model reads documents by, when it reads them
    setting = cfg.data.document_setting
    eod = eod_id(cfg, setting) if setting is not None else None
    ctx = build_context(cfg, state, vocab, device, eod)
    names: List[str] = []
    if state.pp > 1:
        layers = pipeline_layers(cfg.model, ctx)
        names = [layer.name for layer in layers]
        # DeepSpeed broadcasts the tied embedding in place while building the module (and
        # again when loading): under no_grad that copy stays out of the autograd graph.
        if cfg.parallel.virtual_pipeline_size > 1:  # interleaved: our executor's chunks
            module = chunked_module(layers, cfg, state)
        else:
            with torch.no_grad():
                module = pipeline_module(layers, cfg.parallel.pipeline_partition_method, state,
                                         pipeline_stage_layers(cfg))
    else:
        module = GPTModel(cfg.model, ctx)
    mark_tensor_parallel(module)  # what DeepSpeed reads on TP parameters before it wraps them
    mark("model build")
    return BuiltModel(ctx, module, names)


def _init_from(cfg: Config, model: BuiltModel, state: ParallelState, vocab: int,
               text_vocab: int, resume: Optional[Resume], timer: StartupTimer) -> None:
    """checkpoint.init_from's weights into the model before an engine wraps it, so the
    optimizer's fp32 masters start from them; not when the run resumes its own checkpoint."""
    path = cfg.checkpoint.init_from
    if path is None:
        return
    if resume is not None:
        log.info("checkpoint.init_from=%s is not used: this run resumes from its checkpoint", path)
        return
    from megatron.checkpoint.init_from import load_initial_weights
    load_initial_weights(model.named_parameters(), cfg, state, vocab, text_vocab)
    timer.mark("init_from")


def wrap(cfg: Config, model: BuiltModel, state: ParallelState, device: torch.device,
         ds_config: Dict[str, Any], timer: Optional[StartupTimer] = None) -> Engine:
    """The engine around the model, with the optimizer settings and deepspeed.json."""
    return Engine(model.module, model.layer_names, state, device, ds_config, cfg.optimizer,
                  cfg.training, timer.mark if timer is not None else None,
                  pipeline_schedule=cfg.parallel.pipeline_schedule, expert=model.ctx.expert)


def write_run_files(job: Job, cfg: Config) -> None:
    """config.yaml (the file to resume with) is replaced only once the run has started: a start
    that fails leaves the previous one in place. Rank 0 only. checkpoint.roll_back is recorded
    as done (false): resumed with this file and its checkpoint.load as given, the run is refused
    below its newer checkpoints instead of rolling back a second time."""
    if job.launch.rank == 0:
        done = dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint,
                                                                       roll_back=False))
        job.run.write_run_files(done.to_yaml(), json.dumps(job.ds_config, indent=2))
