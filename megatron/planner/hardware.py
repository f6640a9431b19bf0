"""Cluster descriptions: per-device memory and peak FLOPs, node size, link bandwidths.

Memory is in GiB (2**30 bytes), the unit torch's allocator statistics and Megatron's logs use
("MB" there is 2**20 bytes); bandwidths are in GB/s (1e9 bytes), the unit vendors quote. A
cluster YAML file carries the same fields as ClusterSpec, optionally with a `constants` mapping
(a calibrated profile, see profile.py)."""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from megatron.config import devices
from megatron.config.errors import ConfigError
from megatron.planner.overlap import FRAMEWORKS

@dataclass(frozen=True)
class Link:
    """A collective over one link class as an alpha-beta fit to nccl-tests/rccl-tests output:
    a call of B bus bytes takes alpha_s + B / bus_bytes_per_s. Bus bytes follow nccl-tests'
    PERFORMANCE.md: 2 (n-1)/n x the buffer for all-reduce, (n-1)/n for reduce-scatter and
    all-gather, the buffer for a send; so one bus bandwidth serves every collective."""
    alpha_s: float
    bus_bytes_per_s: float
    # which class's calibration factors apply: inside a node (comm_eff, latency_scale) or
    # across nodes (inter_comm_eff, inter_latency_scale)
    inter: bool = False

    def seconds(self, bus_bytes: float) -> float:
        return self.alpha_s + bus_bytes / self.bus_bytes_per_s


# What each field of a cluster file holds (docs/planner.md, "Cluster"): the counts are whole
# numbers (YAML's 8.0 is refused as the trainer's config refuses it for an integer field), the
# rest finite numbers; an optional field's null has a meaning, so its 0 is refused, not read as
# null; the latencies may be 0 (a fit's intercept), cpus_per_task 0 leaves -c to Slurm.
_COUNTS = {"gpus_per_node": (1, ""), "cpus_per_task": (0, " (0 leaves -c to Slurm)")}
_OPTIONAL = {"pair_gbps": "null where no device pair has a faster link",
             "fp32_tflops": "null for a quarter of peak_tflops",
             "fp8_tflops": "null where the device has no FP8"}
_LATENCIES = ("intra_latency_us", "inter_latency_us")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# emit.sbatch_script writes a launcher_env value as export KEY="value": inside those quotes these
# would end the string or run a command ($VAR and ${VAR} are expanded, as the job's shell would)
_ENV_UNSAFE = ('"', "\\", "`", "$(")


def _finite(value: Any) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value))


def _field_problem(key: str, value: Any) -> Optional[Tuple[str, Any, str]]:
    """(field, value, expected) for ConfigError where `value` is wrong for the cluster field
    `key`, else None."""
    if key == "name":
        if not isinstance(value, str) or not value.strip() or not value.isprintable():
            return ("cluster.name", value, "a non-empty string of printable characters (no "
                    "newline, tab or other control character: the sbatch script and the config "
                    "name it in a comment)")
    elif key == "framework":
        if not isinstance(value, str) or value not in FRAMEWORKS:
            return "cluster.framework", value, f"one of {', '.join(FRAMEWORKS)}"
    elif key == "launcher_env":
        return _launcher_env_problem(value)
    elif key in _COUNTS:
        least, note = _COUNTS[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            return (f"cluster.{key}", value,
                    f"a whole number >= {least}{note}, written without a decimal point")
    elif key in _OPTIONAL:
        if value is not None and not (_finite(value) and value > 0):
            return f"cluster.{key}", value, f"a finite number above 0, or {_OPTIONAL[key]}"
    elif key in _LATENCIES:
        if not (_finite(value) and value >= 0):
            return f"cluster.{key}", value, "a finite number of microseconds >= 0"
    elif not (_finite(value) and value > 0):
        return f"cluster.{key}", value, "a finite number above 0"
    return None


def _launcher_env_problem(env: Any) -> Optional[Tuple[str, Any, str]]:
    if not isinstance(env, dict):
        return ("cluster.launcher_env", env, "a mapping of environment variable names to "
                "values (NCCL_DEBUG: WARN), or {} for none")
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            return ("cluster.launcher_env", name, "environment variable names as its keys: "
                    "[A-Za-z_][A-Za-z0-9_]* (letters, digits and _, not starting with a digit)")
        if isinstance(value, bool):
            return (f"cluster.launcher_env.{name}", value, "a string or a number (quote "
                    "true/false/yes/no/on/off: YAML reads them as booleans)")
        if not (_finite(value) or isinstance(value, str)):
            return (f"cluster.launcher_env.{name}", value, "a string or a number (finite), "
                    "not a list, a mapping or null")
        text = str(value)
        if not text.isprintable() or any(s in text for s in _ENV_UNSAFE):
            return (f"cluster.launcher_env.{name}", value, "a value with no newline or other "
                    "control character and none of \" \\ ` $( (the sbatch script writes it as "
                    'export KEY="value")')
    return None


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    gpu_memory_gb: float        # GiB per device
    peak_tflops: float          # dense bf16/fp16 matrix peak per device
    gpus_per_node: int
    intra_node_gbps: float      # per device, slowest link a ring inside a node uses
    inter_node_gbps: float      # per node, all NICs together; shared by the node's devices
    pair_gbps: Optional[float] = None   # faster link inside a device pair (MI250X: 2 GCDs)
    hbm_gbps: float = 1600.0    # device memory bandwidth, for memory-bound kernels
    fp32_tflops: Optional[float] = None  # fp32 matrix peak; None: a quarter of peak_tflops
    # dense FP8 matrix peak (config/devices.PEAK_FP8_TFLOPS); None: no FP8 matrix units, and
    # a job with FP8 matrix multiplies (Job.fp8, planner/fp8.py) is refused on this cluster
    fp8_tflops: Optional[float] = None
    cpus_per_task: int = 0      # sbatch -c; 0 leaves it to Slurm
    launcher_env: Dict[str, str] = field(default_factory=dict)
    # Alpha-beta per link class (docs/planner.md, "Collectives"): the bus bandwidth a large
    # all-reduce reaches as a share of the nominal link (nccl-tests "busbw"), and the intercept
    # of the fit (the time of a call of the sizes TP and DP use, extrapolated to zero bytes).
    intra_bus_eff: float = 0.7
    inter_bus_eff: float = 0.7
    intra_latency_us: float = 20.0
    inter_latency_us: float = 30.0
    # the engine that runs the job, which decides what communication hides behind compute
    # (overlap.OVERLAP) and its model states (memory.stage_states): deepspeed (this trainer),
    # megatron-deepspeed, megatron-lm, megatron-lm-2021, megatron-core, fsdp, aa-scaling,
    # nanotron
    framework: str = "deepspeed"

    def __post_init__(self):
        # every spec, a preset's, a file's (spec_from_dict names the file first) or one that
        # dataclasses.replace made, holds values the planner and the sbatch script can use
        for f in dataclasses.fields(self):
            problem = _field_problem(f.name, getattr(self, f.name))
            if problem:
                hint = ("fix the cluster YAML file or --framework" if f.name == "framework"
                        else "fix the cluster YAML file")
                raise ConfigError(*problem, hint)

    def matmul_tflops(self, precision: str) -> float:
        if precision == "fp32":
            return self.fp32_tflops or self.peak_tflops / 4
        return self.peak_tflops

    def group_gbps(self, size: int, stride: int) -> float:
        """Nominal per-device bandwidth of a collective over `size` ranks spaced `stride` apart.

        Ranks are numbered node by node, so a group stays inside a node when size*stride fits
        in one. A group that leaves the node shares the node's NICs with the other groups of
        its kind on that node (all communicate at once): a group with k members in each node
        is one of g/k such groups, so it gets k/g of the NICs (NCCL rings and trees cross each
        node boundary once per channel, whatever k is)."""
        if size <= 1:
            return float("inf")
        g = self.gpus_per_node
        if size * stride <= g:
            if size == 2 and stride == 1 and self.pair_gbps:
                return self.pair_gbps
            return self.intra_node_gbps
        per_node = max(1, min(size, g // stride))
        return min(self.intra_node_gbps, self.inter_node_gbps * per_node / g)

    def link(self, size: int, stride: int) -> Link:
        """The alpha-beta link of a group (group_gbps' topology, the class's fit)."""
        if size <= 1:
            return Link(0.0, float("inf"))
        nominal = self.group_gbps(size, stride)
        if size * stride <= self.gpus_per_node:
            return Link(self.intra_latency_us * 1e-6, nominal * self.intra_bus_eff * 1e9)
        bus = min(self.intra_node_gbps * self.intra_bus_eff, nominal * self.inter_bus_eff)
        return Link(self.inter_latency_us * 1e-6, bus * 1e9, inter=True)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


# Link fits (docs/planner.md, "Collectives", cites each figure; "approximate" ones are marked
# there). Bus efficiency = nccl-tests busbw of a large all-reduce / nominal per-direction link.
# Device peaks come from the one table the trainer and the benchmarks read too.
_TF, _HBM, _FP8 = devices.PEAK_TFLOPS, devices.PEAK_HBM_GBPS, devices.PEAK_FP8_TFLOPS
PRESETS: Dict[str, ClusterSpec] = {
    # One MI250X GCD is one device; two GCDs of a package share 200 GB/s, other pairs 50-100;
    # one 25 GB/s Slingshot NIC per MI250X, 100 GB/s per node. Its job environment is not a
    # launcher_env here: emit.sbatch_script writes megatron/launch/frontier_env.py's, the
    # one source examples/frontier/env.sh shares. No rccl-tests bandwidth table
    # for a Frontier node was at hand: 0.6 is the share the paper's 175B figure was fitted
    # with; 25 us is RCCL's small all-reduce on 16 MI250X GCDs before its 1-shot kernel.
    "frontier": ClusterSpec("frontier", 64, _TF["mi250x"], 8, 50, 100, pair_gbps=200,
                            hbm_gbps=_HBM["mi250x"],
                            fp32_tflops=47.9, cpus_per_task=7,
                            intra_bus_eff=0.6, inter_bus_eff=0.6, intra_latency_us=25,
                            inter_latency_us=30),
    # 7 xGMI links of 64 GB/s per direction; 8 x 400 Gb/s NICs.
    "mi300x": ClusterSpec("mi300x", 192, _TF["mi300x"], 8, 64 * 7, 400,
                          hbm_gbps=_HBM["mi300x"], fp32_tflops=163.4, fp8_tflops=_FP8["mi300x"],
                          intra_bus_eff=0.67, inter_bus_eff=0.9, intra_latency_us=25,
                          inter_latency_us=30),
    # The MI300X's chip and node with 256 GB of HBM3E at 6 TB/s (its links assumed the MI300X's).
    "mi325x": ClusterSpec("mi325x", 256, _TF["mi325x"], 8, 64 * 7, 400,
                          hbm_gbps=_HBM["mi325x"], fp32_tflops=163.4, fp8_tflops=_FP8["mi325x"],
                          intra_bus_eff=0.67, inter_bus_eff=0.9, intra_latency_us=25,
                          inter_latency_us=30),
    # NVLink 3: 300 GB/s per direction through NVSwitch; 8 x HDR 200 Gb/s (DGX A100).
    "a100": ClusterSpec("a100", 80, _TF["a100"], 8, 300, 200, hbm_gbps=_HBM["a100"],
                        fp32_tflops=19.5,
                        intra_bus_eff=0.73, inter_bus_eff=0.9, intra_latency_us=25,
                        inter_latency_us=30),
    # NVLink 4: 450 GB/s per direction; 8 x NDR 400 Gb/s.
    "h100": ClusterSpec("h100", 80, _TF["h100"], 8, 450, 400, hbm_gbps=_HBM["h100"],
                        fp32_tflops=67, fp8_tflops=_FP8["h100"],
                        intra_bus_eff=0.82, inter_bus_eff=0.9, intra_latency_us=25,
                        inter_latency_us=30),
    "h200": ClusterSpec("h200", 140, _TF["h200"], 8, 450, 400, hbm_gbps=_HBM["h200"],
                        fp32_tflops=67, fp8_tflops=_FP8["h200"],
                        intra_bus_eff=0.82, inter_bus_eff=0.9, intra_latency_us=25,
                        inter_latency_us=30),
    # The 40 GB A100 SXM (DGX A100 40 GB): the 80 GB part's links and peak, 40 GiB of HBM2 at
    # 1555 GB/s (NVIDIA A100 datasheet; config/devices.py holds the 80 GB part's 2039).
    "a100-40gb": ClusterSpec("a100-40gb", 40, _TF["a100"], 8, 300, 200, hbm_gbps=1555,
                             fp32_tflops=19.5,
                             intra_bus_eff=0.73, inter_bus_eff=0.9, intra_latency_us=25,
                             inter_latency_us=30),
    # An H100 node of 96 GB parts: JUPITER's booster node (apps.fz-juelich.de, "JUPITER
    # Hardware Overview"): 4 GH200, each Hopper with 96 GB HBM3 at 4 TB/s, NVLink 4 between
    # every pair at 150 GB/s per direction, 4 x InfiniBand NDR200 = 100 GB/s a node.
    "gh200": ClusterSpec("gh200", 96, _TF["h100"], 4, 150, 100, hbm_gbps=_HBM["gh200"],
                         fp32_tflops=67, fp8_tflops=_FP8["h100"],
                         intra_bus_eff=0.82, inter_bus_eff=0.9, intra_latency_us=25,
                         inter_latency_us=30),
}
PRESETS["mi250x"] = PRESETS["frontier"]
# The names the CLI's help and errors list (every preset, and those with FP8 matrix units).
PRESET_NAMES = ", ".join(PRESETS)
FP8_PRESET_NAMES = ", ".join(name for name, spec in PRESETS.items() if spec.fp8_tflops)


def spec_from_dict(raw: Dict[str, Any], source: str) -> ClusterSpec:
    known = {f.name for f in dataclasses.fields(ClusterSpec)}
    unknown = sorted(set(raw) - known - {"constants", "fitted"})
    if unknown:
        keys = ", ".join(sorted(known | {"base", "constants"}))
        raise ConfigError(f"cluster.{unknown[0]}", raw[unknown[0]], f"a known cluster key ({keys})",
                          f"remove or rename it in {source}")
    missing = [k for k in ("gpu_memory_gb", "peak_tflops", "gpus_per_node", "intra_node_gbps",
                           "inter_node_gbps") if k not in raw]
    if missing:
        raise ConfigError(f"cluster.{missing[0]}", None, "a value", f"add it to {source}")
    values = {k: v for k, v in raw.items() if k in known}
    values.setdefault("name", source)
    if values.get("launcher_env") is None:
        values["launcher_env"] = {}
    for key, value in values.items():
        problem = _field_problem(key, value)
        if problem:
            raise ConfigError(*problem, f"fix it in {source}")
    values["launcher_env"] = {k: str(v) for k, v in values["launcher_env"].items()}
    return ClusterSpec(**values)

