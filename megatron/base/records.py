"""The records a run writes and others read back, defined once: a checkpoint's meta.json and the
lines of metrics.jsonl. Writers build these types; every reader (resume, conversion, the job
chain, the planner's trials, benchmarks, tests) parses through them, so a key is named here and
nowhere else (tests/unit/test_base_records.py holds that).

Standard library only: the planner reads metrics on a login node without torch.

meta.json (one per committed checkpoint, written last by rank 0):
    format            "megatron-frontier/sharded-v2" (v1: the same without "data"): the version
                      of this record and the layout of the files beside it; a reader refuses
                      one it does not know
    step              the optimizer steps taken
    consumed_samples  samples the data iterator has handed out (the data position)
    layout            what wrote it: TP, PP, DP, ZeRO stage, padded and tokenizer vocabulary,
                      and the model fields that decide a weight's shape (LayoutRecord)
    saved_at          Unix time of the save
    scheduler         the LR schedule's state_dict
    adam_step         AdamW's step count
    engine            DeepSpeed's counters (global_steps, global_samples, skipped_steps, the
                      fp16 loss scaler)
    files             every file of the checkpoint and its size in bytes
    data              what defines the sample stream consumed_samples counts in (DataRecord)

metrics.jsonl (one JSON object per line, appended): StepRecord for each logged step,
EvalRecord for evaluations, and one line per event carrying "event": EVENTS declares every kind
the trainer writes (save, stop, diverged, spike, rollback, hang, straggler, unresponsive,
sdc_suspect, state_suspect, batch_size); megatron-report lists and marks the kinds it finds
there. Non-finite numbers are written as null and named in "nonfinite"."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Type, Union


class RecordError(ValueError):
    """A record that does not fit its definition; the message names the key."""


def _check_keys(obj: Any, cls, what: str, optional: Tuple[str, ...] = ()) -> None:
    if not isinstance(obj, dict):
        raise RecordError(f"{what} is a {type(obj).__name__}, not a JSON object")
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in obj and n not in optional]
    unknown = sorted(set(obj) - set(names))
    if missing:
        raise RecordError(f"{what} lacks the key(s) {', '.join(missing)}")
    if unknown:
        raise RecordError(f"{what} has unknown key(s) {', '.join(unknown)} (written by another "
                          "version of megatron-frontier?)")


def _typed(obj: Dict[str, Any], what: str, /, **kinds) -> None:
    """Refuses a value of the wrong JSON type: kinds maps a key to int, float, str, bool, dict,
    list or (type, None) for a nullable one. A bool is not a number here."""
    for key, kind in kinds.items():
        value, nullable = obj.get(key), isinstance(kind, tuple)
        kind = kind[0] if nullable else kind
        if value is None and nullable:
            continue
        ok = isinstance(value, kind) and not (isinstance(value, bool) and kind is not bool)
        if kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not ok:
            raise RecordError(f"{what}: {key} is {value!r}, expected "
                              f"{'null or ' if nullable else ''}a JSON {kind.__name__}")


_SCALARS = (int, float, str, bool)


def check_scalar_types(cls, obj: Dict[str, Any], what: str, metrics: bool = False) -> None:
    """RecordError naming `what` and the key when a value of `obj` present for one of the
    dataclass `cls`'s scalar fields has the wrong JSON type (_scalar_kinds); for any JSON
    record this package reads back. metrics: a metrics line's rules for null."""
    _typed(obj, what, **{k: v for k, v in _scalar_kinds(cls, metrics).items() if k in obj})


@functools.lru_cache(maxsize=None)
def _scalar_kinds(cls, metrics: bool) -> Dict[str, Any]:
    """_typed's kinds for a dataclass's scalar fields, from its annotations: an Optional[...]
    one may be null, and in a metrics line (metrics) a float too (the writer puts null for a
    non-finite value) and an int other than the step; lists, mappings and nested records are
    checked where read."""
    kinds: Dict[str, Any] = {}
    for name, hint in typing.get_type_hints(cls).items():
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = typing.get_origin(hint) is Union and len(args) == 1
        kind = args[0] if optional else hint
        if kind not in _SCALARS:
            continue
        nullable = optional or (metrics and (kind is float or (kind is int and name != "step")))
        kinds[name] = (kind, None) if nullable else kind
    return kinds


# --- the checkpoint record --------------------------------------------------------------------

FORMAT_V1 = "megatron-frontier/sharded-v1"  # before the data stream was recorded
FORMAT = "megatron-frontier/sharded-v2"     # written now: v1 and the data record
FORMATS = (FORMAT_V1, FORMAT)  # every version this code reads


@dataclass(frozen=True)
class LayoutRecord:
    """The layout that wrote a checkpoint and the model it holds: on resume the model must match,
    the layout may change."""
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    zero_stage: int
    padded_vocab_size: int
    vocab_size: int
    model: Dict[str, Any]  # checkpoint.layout.SHAPE_FIELDS by name
    # parallel.context_parallel_size; absent from checkpoints written before it existed, and
    # left out on disk when 1, so a checkpoint without context parallelism reads as before.
    # Shard files are named by RankCoord, whose dp_cp is the rank's index over data x context
    # parallel (parallel/state.py): with this degree 1 that is the data-parallel rank.
    context_parallel_size: int = 1
    # parallel.expert_parallel_size, the same way: for the record and the resume's log line
    # only (experts are stored on their global axis, checkpoint/experts.py, read at any EP)
    expert_parallel_size: int = 1

    def text(self) -> str:
        cp = f" CP{self.context_parallel_size}" if self.context_parallel_size > 1 else ""
        ep = f" EP{self.expert_parallel_size}" if self.expert_parallel_size > 1 else ""
        return (f"TP{self.tensor_parallel_size} PP{self.pipeline_parallel_size} "
                f"DP{self.data_parallel_size}{cp}{ep} ZeRO-{self.zero_stage}")

    def to_json(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in _DEGREES_LEFT_OUT_AT_1:
            if out[key] == 1:
                del out[key]
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "LayoutRecord":
        _check_keys(obj, cls, "its layout", optional=_DEGREES_LEFT_OUT_AT_1)
        _typed(obj, "its layout", tensor_parallel_size=int, pipeline_parallel_size=int,
               data_parallel_size=int, zero_stage=int, padded_vocab_size=int, vocab_size=int,
               model=dict)
        _typed(obj, "its layout", **{k: int for k in _DEGREES_LEFT_OUT_AT_1 if k in obj})
        return cls(**obj)


# LayoutRecord's degrees added after checkpoints were written without them: left out on disk
# at 1, so a checkpoint without them reads as before, and one written at 1 still reads in the
# versions before them (which refuse one written with the key, naming it)
_DEGREES_LEFT_OUT_AT_1 = ("context_parallel_size", "expert_parallel_size")


@dataclass(frozen=True)
class DataRecord:
    """What defines the stream of samples that consumed_samples counts: a resume that changes
    one of these would continue at a position of another stream (checkpoint.layout.check_data)."""
    seq_length: int
    synthetic: bool
    paths: List[str]
    split: str
    tokenizer_type: str
    tokenizer_model: Optional[str]
    vocab_file: Optional[str]
    merges_file: Optional[str]
    seed: int  # data.seed: the document and sample shuffles
    # One per data.paths prefix (data/fingerprint.py): the data's identity by content, so the
    # same files elsewhere resume. None: synthetic data, or a checkpoint written before them,
    # whose paths are compared instead.
    fingerprints: Optional[List[str]] = None
    # training.global_batch_size of the steps that wrote the checkpoint: not part of the stream
    # (consumed_samples counts samples), but a resume that changes it says what happens to the
    # position (training/checkpointer.py, BatchSizeEvent). None in checkpoints written before.
    global_batch_size: Optional[int] = None
    # training.rampup_batch_size, the same way; written only when set (to_json), so versions
    # before it still read the checkpoints of runs without a ramp
    rampup_batch_size: Optional[List[int]] = None

    def to_json(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        if out["rampup_batch_size"] is None:
            del out["rampup_batch_size"]
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "DataRecord":
        _check_keys(obj, cls, "its data record",
                    optional=("fingerprints", "global_batch_size", "rampup_batch_size"))
        _typed(obj, "its data record", seq_length=int, synthetic=bool, paths=list, split=str,
               tokenizer_type=str, tokenizer_model=(str, None), vocab_file=(str, None),
               merges_file=(str, None), seed=int, fingerprints=(list, None),
               global_batch_size=(int, None), rampup_batch_size=(list, None))
        return cls(**obj)


@dataclass(frozen=True)
class OptimizerRecord:
    """The engine's part of a checkpoint beside the tensors: the same on every rank."""
    scheduler: Dict[str, Any]
    adam_step: int
    engine: Dict[str, Any]  # DeepSpeed's counters (engine/state.py)


@dataclass(frozen=True)
class CheckpointMeta:
    step: int
    consumed_samples: int
    layout: LayoutRecord
    saved_at: float
    optimizer: OptimizerRecord
    files: Dict[str, int] = field(default_factory=dict)
    data: Optional[DataRecord] = None  # None only in v1 checkpoints
    format: str = FORMAT

    def to_json(self) -> Dict[str, Any]:
        out = {"format": self.format, "step": self.step, "consumed_samples": self.consumed_samples,
               "layout": self.layout.to_json(), "saved_at": self.saved_at,
               "files": dict(self.files)}
        out.update(dataclasses.asdict(self.optimizer))  # flat on disk, as v1 was written
        if self.data is not None:
            out["data"] = self.data.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "CheckpointMeta":
        """Raises RecordError naming the key that is missing or unknown."""
        if not isinstance(obj, dict):
            raise RecordError("it is not a JSON object")
        fmt = obj.get("format")
        if fmt not in FORMATS:
            raise RecordError(f"its format is {fmt!r}; this version of megatron-frontier reads "
                              f"{', '.join(FORMATS)}")
        opt_keys = [f.name for f in dataclasses.fields(OptimizerRecord)]
        top = {k: v for k, v in obj.items() if k not in opt_keys}
        top["optimizer"] = None
        _check_keys(top, cls, "it", optional=("data",) if fmt == FORMAT_V1 else ())
        if fmt == FORMAT_V1 and "data" in obj:
            raise RecordError(f"it has the key data, which a {FORMAT_V1} record does not")
        missing = [k for k in opt_keys if k not in obj]
        if missing:
            raise RecordError(f"it lacks the key(s) {', '.join(missing)}")
        _typed(obj, "it", step=int, consumed_samples=int, saved_at=float, files=dict,
               scheduler=dict, adam_step=int, engine=dict)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in obj["files"].values()):
            raise RecordError("it: files holds a size that is not a whole number")
        return cls(step=obj["step"], consumed_samples=obj["consumed_samples"],
                   layout=LayoutRecord.from_json(obj["layout"]), saved_at=float(obj["saved_at"]),
                   optimizer=OptimizerRecord(obj["scheduler"], obj["adam_step"], obj["engine"]),
                   files=dict(obj["files"]),
                   data=DataRecord.from_json(obj["data"]) if "data" in obj else None, format=fmt)

    def size_bytes(self) -> int:
        return sum(self.files.values())


# --- metrics.jsonl ----------------------------------------------------------------------------

@dataclass(frozen=True)
class StartupRecord:
    """Where the time from this rank's launch to its first step went (launch/startup.py)."""
    total_s: float
    phases: Dict[str, float]  # in order, seconds each
    first_step_at: float      # Unix time the first step began
    first_step_s: float       # how long it took

    @classmethod
    def from_json(cls, obj: Any, where: str = "the startup record") -> "StartupRecord":
        _check_keys(obj, cls, where)
        return cls(**obj)


@dataclass(frozen=True)
class StepRecord:
    """One logged training step."""
    step: int
    loss: Optional[float]
    lr: float
    grad_norm: Optional[float]
    tokens_per_sec: float
    tflops_per_gpu: float
    mfu: Optional[float]      # None when the device's peak is unknown
    mem_gb: float             # peak device memory; the process's peak RSS on the CPU
    loss_scale: Optional[float]  # fp16 only
    skipped: bool             # the optimizer skipped the update (fp16 overflow)
    step_time_s: float
    startup: Optional[StartupRecord] = None  # the first line written only
    nonfinite: Optional[List[str]] = None
    # MoE runs only (absent from dense lines): per MoE layer, in order, rank 0's training
    # forwards since the previous logged line: aux_loss, z_loss (mean per forward, coefficients
    # applied), tokens_per_expert_max, tokens_per_expert_mean (assignments before the capacity
    # rule), dropped_fraction (model/moe/layer.LayerStats.as_dict)
    moe: Optional[List[Dict[str, float]]] = None
    # runs with a batch-size ramp only (training.rampup_batch_size): the step's global batch
    global_batch_size: Optional[int] = None


@dataclass(frozen=True)
class EvalRecord:
    step: int
    split: str  # "valid" during training, "test" once after it
    loss: Optional[float]
    nonfinite: Optional[List[str]] = None


@dataclass(frozen=True)
class SaveEvent:
    """A committed checkpoint: seconds from the save's start to its commit, and of those what the
    loop waited (blocking_s: all of it for a synchronous save; the snapshot, the copy the next
    optimizer step waited for and the commit for an asynchronous one) and what the writer
    spent in the background (background_s). Lines written before these two lack them (None)."""
    step: int
    seconds: float
    gb: float
    gb_per_s: Optional[float]
    blocking_s: Optional[float] = None
    background_s: Optional[float] = None
    event: str = "save"


@dataclass(frozen=True)
class StopEvent:
    """The run stops with a checkpoint before training.train_iters (reason: "deadline", or
    "signal": SIGTERM, SIGUSR1, SIGHUP, SIGQUIT or a first Ctrl-C)."""
    step: int
    reason: str
    event: str = "stop"


@dataclass(frozen=True)
class DivergedEvent:
    step: int
    reason: str
    event: str = "diverged"


@dataclass(frozen=True)
class SpikeEvent:
    step: int
    reason: str
    event: str = "spike"


@dataclass(frozen=True)
class RollbackEvent:
    step: int
    to_step: int
    reason: str
    event: str = "rollback"


@dataclass(frozen=True)
class HangEvent:
    """A rank's watchdog found a phase past its limit (training/watchdog.py); written by that
    rank, whichever it is. The stacks of its threads are in <run.dir>/hangs/."""
    step: int
    rank: int
    host: str
    phase: str      # start-up, step, agreement, guard, evaluation, after-step, save, load
    seconds: float  # in the phase so far
    limit_s: float
    event: str = "hang"


@dataclass(frozen=True)
class StragglerEvent:
    """A rank whose median forward pass over the last resilience.straggler_interval steps was
    `ratio` times the other ranks' median, in this window and the one before
    (training/stragglers.py)."""
    step: int
    rank: int
    host: str
    ratio: float
    event: str = "straggler"


@dataclass(frozen=True)
class UnresponsiveEvent:
    """After a hang, the ranks whose watchdog never reported (a stopped process, a dead node, a
    rank stuck outside the collective the others wait in), written once per job by the first
    reporting rank to claim it; their nodes are added to <run.dir>/bad_nodes."""
    step: int
    ranks: List[int]
    nodes: List[str]
    phase: str     # where the reporting ranks waited
    reported: int  # how many ranks reported a hang
    event: str = "unresponsive"


@dataclass(frozen=True)
class SdcSuspectEvent:
    """A suspect step (a spike or a non-finite loss) computed again on the same weights and
    batch gave this rank a different result: a silent data error (training/sdc.py)."""
    step: int
    rank: int
    host: str
    first: float   # the rank's own loss in the step
    again: float   # the same, computed again
    event: str = "sdc_suspect"

    def describe(self) -> str:
        return f"loss {self.first!r}, computed again {self.again!r}: a silent data error"


@dataclass(frozen=True)
class StateSuspectEvent:
    """After this step's update, this rank's optimizer state or weights broke an invariant
    (training/state_check.py, resilience.check_state): a silent data error outside the forward
    pass. known: this rank is the faulty one (false: one of two replicas that disagree)."""
    step: int
    rank: int
    host: str
    what: str
    known: bool
    event: str = "state_suspect"

    def describe(self) -> str:
        return (f"{self.what}: a silent data error in the training state"
                + ("" if self.known else " (one of two replicas that disagree)"))


@dataclass(frozen=True)
class BatchSizeEvent:
    """A resume whose training.global_batch_size differs from the one the checkpoint's steps were
    trained with (training/checkpointer.py): the data continues at sample consumed_samples (none
    skipped or repeated), global_batch_size samples a step, for the steps_left steps up to
    training.train_iters, which take samples_left samples."""
    step: int                   # the checkpoint's step
    consumed_samples: int
    before: Optional[int]       # the checkpoint's batch size; None when it did not record it
    global_batch_size: int      # this run's
    steps_left: int
    samples_left: int
    event: str = "batch_size"
    # training.rampup_batch_size, the checkpoint's and this run's, where either has one
    ramp_before: Optional[List[int]] = None
    ramp: Optional[List[int]] = None


@dataclass(frozen=True)
class LrScheduleEvent:
    """A resume whose learning-rate schedule differs from the one the checkpoint recorded
    (engine/optimizer.schedule_change): the step numbers go on, so the schedule is read at the
    checkpoint's position under the new settings, and the rate can jump."""
    step: int            # the checkpoint's step
    changed: str         # "field before -> after; ..." (optimizer.lr, the decay's end, ...)
    lr_before: float     # the next step's rate under the checkpoint's schedule
    lr_after: float      # under this run's
    event: str = "lr_schedule"


EVENTS: Dict[str, Type] = {c.event: c for c in (SaveEvent, StopEvent, DivergedEvent,  # type: ignore
                                                SpikeEvent, RollbackEvent, HangEvent,
                                                StragglerEvent, UnresponsiveEvent,
                                                SdcSuspectEvent, StateSuspectEvent,
                                                BatchSizeEvent, LrScheduleEvent)}
MetricsRecord = Union[StepRecord, EvalRecord, SaveEvent, StopEvent, DivergedEvent, SpikeEvent,
                      RollbackEvent, HangEvent, StragglerEvent, UnresponsiveEvent,
                      SdcSuspectEvent, StateSuspectEvent, BatchSizeEvent, LrScheduleEvent]
_OPTIONAL = ("startup", "nonfinite", "moe", "global_batch_size", "ramp_before", "ramp")


def record_json(record: MetricsRecord) -> Dict[str, Any]:
    """The line's object (before strict-JSON cleaning): an event's kind first, optional keys
    only when set."""
    obj = {k: v for k, v in dataclasses.asdict(record).items()
           if not (k in _OPTIONAL and v is None)}
    if "event" in obj:
        obj = {"event": obj.pop("event"), **obj}
    return obj


def is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def strict_json_record(record: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str]]:
    """The record with NaN and +-infinity replaced by None, and the keys replaced (dotted for
    nested dicts). Python's json writes NaN/Infinity, which strict readers (jq, JavaScript,
    most JSON libraries) reject; one bad step must not make the whole file unreadable."""
    nonfinite: List[str] = []

    def clean(value, key):
        if isinstance(value, dict):
            return {k: clean(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{key}[{i}]") for i, v in enumerate(value)]
        if not is_number(value):
            return value
        if isinstance(value, numbers.Integral):
            return int(value)  # numpy scalars are not JSON-serializable
        if not math.isfinite(value):
            nonfinite.append(key)
            return None
        return float(value)

    line = clean(record, "")
    if nonfinite:
        line["nonfinite"] = nonfinite
    return line, nonfinite


def parse_metrics_line(obj: Any, where: str = "a metrics line") -> MetricsRecord:
    """The record of one line. Step and evaluation lines of older versions may lack keys added
    since (step_time_s, ...): those read as None. An unknown key or event is an error naming
    `where`."""
    if not isinstance(obj, dict):
        raise RecordError(f"{where} is not a JSON object")
    if "event" in obj:
        cls = EVENTS.get(obj["event"])
        if cls is None:
            raise RecordError(f"{where}: unknown event {obj['event']!r}; known: "
                              f"{', '.join(EVENTS)}")
        added = tuple(f.name for f in dataclasses.fields(cls) if f.default is None)
        _check_keys(obj, cls, where, optional=added)  # keys added since may be absent
        check_scalar_types(cls, obj, where, metrics=True)
        return cls(**obj)
    cls = EvalRecord if "split" in obj else StepRecord
    names = [f.name for f in dataclasses.fields(cls)]
    _check_keys(obj, cls, where, optional=tuple(n for n in names if n != "step"))
    check_scalar_types(cls, obj, where, metrics=True)
    values = {n: obj.get(n) for n in names}
    if values.get("startup") is not None:
        values["startup"] = StartupRecord.from_json(values["startup"], f"{where}: startup")
    return cls(**values)


class NotJson(RecordError):
    """A metrics line that is not JSON text at all: cut short, zero-filled or not UTF-8."""


def parse_metrics_bytes(raw: bytes, where: str) -> MetricsRecord:
    """The record of one line as stored (without its newline); RecordError saying why it is
    none, naming `where`."""
    if b"\0" in raw:
        # A node that crashes can leave the file's last blocks zero-filled: NUL bytes, not text.
        raise NotJson(f"{where} holds {raw.count(0)} NUL byte(s) (zero-filled by a crash)")
    try:
        obj = json.loads(raw.decode())
    except UnicodeDecodeError:
        raise NotJson(f"{where} is not UTF-8 text") from None
    except ValueError as e:
        raise NotJson(f"{where} is not JSON ({e})") from None
    return parse_metrics_line(obj, where)


def read_metrics(path: str, skipped: Optional[List[str]] = None) -> List[MetricsRecord]:
    """Every record of a metrics.jsonl. A last line that is not JSON (the run was killed while
    writing it, or is writing it now) is left out; any other line that is not a record is a
    RecordError naming the file and line, for readers that must not read past one. With
    `skipped` (a list) such a line is left out and described there instead ("<path>:<line> why"),
    the cut last line too: how megatron-report reads a run a crash damaged."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    out: List[MetricsRecord] = []
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            out.append(parse_metrics_bytes(raw, f"{path}:{i}"))
        except RecordError as e:
            last = i == len(lines)  # no newline after it
            if skipped is not None:
                skipped.append(f"{e}{'; the last line, cut short' if last else ''}")
            elif not (last and isinstance(e, NotJson)):
                raise
    return out


def read_metrics_tail(path: str, max_bytes: int = 1 << 20) -> List[MetricsRecord]:
    """The records of the last `max_bytes` of a metrics.jsonl (a long run's file is large; the
    first line read whole after the cut). [] when the file does not exist."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    if size > max_bytes:
        data = data.split("\n", 1)[1] if "\n" in data else ""
    out: List[MetricsRecord] = []
    for i, text in enumerate(data.split("\n")):
        try:
            out.append(parse_metrics_line(json.loads(text), f"{path} (tail line {i + 1})"))
        except (ValueError, RecordError):
            continue  # a cut or foreign line: the tail is a hint, not a record to refuse
    return out


def steps(records: List[MetricsRecord]) -> List[StepRecord]:
    return [r for r in records if isinstance(r, StepRecord)]


def events(records: List[MetricsRecord], kind: str) -> list:
    return [r for r in records if getattr(r, "event", None) == kind]
