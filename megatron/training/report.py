"""megatron-report: one self-contained HTML page and a PNG per panel for one run or several side
by side (each run a colour in every panel), read from metrics.jsonl through records.read_metrics,
so a run in progress reports what it has logged. A line that is not a record (the half-written
last line of a run in progress, what a crash left) is skipped and named: in the page and in the
list write_report returns, which megatron-report prints as warnings.

Panels: loss (train, valid, test), learning rate, gradient norm, throughput (tokens/s), TFLOP/s
per GPU, MFU, memory and the fp16 loss scale. Every event kind records.EVENTS declares (saves,
stops, spikes, rollbacks, divergence, hangs, unresponsive ranks, stragglers, silent data errors)
is a vertical mark in every panel and a row of the events table, with its rank and node. A
MoE run (step lines with `moe`) adds the expert-load table: per MoE layer, the last logged
step's and the run's largest load (busiest expert's tokens over the mean), auxiliary losses and
dropped share. Steps a run logged and then trained again from an earlier checkpoint (a resume
past the last save, a rollback) are shown the second time, and listed. The page embeds the PNGs
(data: URIs, no other file needed)
and, as JSON in a <script id="series"> element, the x and y of every line as matplotlib holds
them after plotting, which a test compares with metrics.jsonl. matplotlib runs headless (Agg)."""
from __future__ import annotations

import base64
import html
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from megatron.base.outputs import check_output, write_text_whole, write_whole
from megatron.base.records import EVENTS, EvalRecord, StepRecord, read_metrics
from megatron.base.rundir import RunDir
from megatron.config.errors import InputError

# (panel, title, y label, StepRecord field(s)); the loss panel adds the evaluations.
PANELS: Tuple[Tuple[str, str, str, str], ...] = (
    ("loss", "Loss", "loss", "loss"),
    ("lr", "Learning rate", "lr", "lr"),
    ("grad_norm", "Gradient norm", "grad norm", "grad_norm"),
    ("throughput", "Throughput", "tokens/s", "tokens_per_sec"),
    ("tflops", "TFLOP/s per GPU", "TFLOP/s", "tflops_per_gpu"),
    ("mfu", "MFU", "MFU", "mfu"),
    ("memory", "Memory", "GB", "mem_gb"),
    ("loss_scale", "Loss scale (fp16)", "loss scale", "loss_scale"),
)
# The kinds are the records' (one home): a kind added there is listed and marked with no change
# here, in the default style until it is given one.
EVENT_KINDS = tuple(EVENTS)
_EVENT_STYLE = {"save": ("tab:green", ":"), "stop": ("black", "-"), "spike": ("tab:orange", "--"),
                "rollback": ("tab:red", "-."), "diverged": ("tab:purple", "-"),
                "hang": ("tab:brown", "-"), "unresponsive": ("tab:red", ":"),
                "straggler": ("tab:olive", "--"), "sdc_suspect": ("tab:pink", "-"),
                "state_suspect": ("tab:pink", ":"),
                "batch_size": ("tab:cyan", "-."), "lr_schedule": ("tab:blue", "-.")}
_DEFAULT_STYLE = ("tab:gray", "--")


@dataclass(frozen=True)
class EventRow:
    """One event as the page lists it: the ranks and nodes it names ("" for none) and the rest."""
    kind: str
    step: int
    ranks: str
    nodes: str
    detail: str


@dataclass
class RunSeries:
    """What one run logged, as plotted: per series a list of (step, value)."""
    name: str
    path: str
    series: Dict[str, List[Tuple[int, float]]] = field(default_factory=dict)
    events: List[EventRow] = field(default_factory=list)
    skipped: List[str] = field(default_factory=list)  # "<metrics.jsonl>:<line> why" per line
    last_step: int = 0
    moe: List[Tuple[int, List[dict]]] = field(default_factory=list)  # (step, StepRecord.moe)
    # (first, last) steps logged and then trained again from an earlier checkpoint (a resume
    # after a crash or a stop past the last save, a rollback): the panels keep the second time
    retrained: List[Tuple[int, int]] = field(default_factory=list)
    logged: int = 0  # the step of the last step line read


class Written(NamedTuple):
    page: str
    skipped: List[str]  # the lines of every run left out, each naming its file and line


def load_run(path: str, name: Optional[str] = None) -> RunSeries:
    metrics = RunDir(path).metrics
    if not os.path.isfile(metrics):
        raise InputError(f"{path} has no metrics.jsonl: expected a run directory (run.dir) of "
                         f"megatron-train that has logged at least one step; pass its run.dir")
    run = RunSeries(name or os.path.basename(os.path.normpath(path)), path)
    for record in read_metrics(metrics, skipped=run.skipped):
        _add(run, record)
    return run


def _add(run: RunSeries, record) -> None:
    if isinstance(record, StepRecord):
        if record.step <= run.logged:
            _retrained(run, record.step)
        run.logged = record.step
        run.last_step = max(run.last_step, record.step)
        for _, _, _, key in PANELS:
            value = getattr(record, key)
            if value is not None:
                run.series.setdefault(f"train/{key}", []).append((record.step, float(value)))
        if record.moe:
            run.moe.append((record.step, record.moe))
    elif isinstance(record, EvalRecord):
        if record.loss is not None:
            run.series.setdefault(f"{record.split}/loss", []).append((record.step, record.loss))
    else:  # an event: read_metrics refuses a kind records.EVENTS does not declare
        run.events.append(_event_row(record))


def _retrained(run: RunSeries, first: int) -> None:
    """A step line at or before the last one read: the run went back to an earlier checkpoint
    and trains from `first` again. Every point from `first` on is the earlier history's and
    leaves the panels (a line drawn in file order would run back over itself)."""
    run.retrained.append((first, run.logged))
    for name, points in run.series.items():
        run.series[name] = [p for p in points if p[0] < first]
    run.moe = [m for m in run.moe if m[0] < first]


def _event_row(event) -> EventRow:
    ranks = getattr(event, "ranks", None) or ([event.rank] if hasattr(event, "rank") else [])
    nodes = getattr(event, "nodes", None) or ([event.host] if hasattr(event, "host") else [])
    return EventRow(event.event, event.step, ", ".join(str(r) for r in ranks),
                    ", ".join(str(n) for n in nodes), _detail(event))


def _num(value, spec: str) -> str:
    """A number as `spec`; anything else (a null the writer put for a non-finite value) as is."""
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


# What an event says beyond its kind, step, ranks and nodes; a kind without an entry shows its
# reason, or else its other fields.
_DETAIL = {
    "save": lambda e: f"{_num(e.gb, '.2f')} GB in {_num(e.seconds, '.1f')} s"
                      + (f", {_num(e.gb_per_s, '.2f')} GB/s" if e.gb_per_s is not None else ""),
    "rollback": lambda e: f"to step {e.to_step}: {e.reason}",
    "hang": lambda e: f"{e.phase} ran {_num(e.seconds, '.1f')} s, past its "
                      f"{_num(e.limit_s, '.1f')} s limit",
    "unresponsive": lambda e: f"never reported; {e.reported} rank(s) waited in {e.phase}",
    "straggler": lambda e: f"forward pass {_num(e.ratio, '.2f')} x the other ranks' median",
    "sdc_suspect": lambda e: e.describe(),
    "state_suspect": lambda e: e.describe(),
    "batch_size": lambda e: f"global batch {e.before} -> {e.global_batch_size} on resume: the "
                            f"data continues at sample {e.consumed_samples}; {e.steps_left} steps "
                            f"left take {e.samples_left} samples",
    "lr_schedule": lambda e: f"learning-rate schedule changed on resume ({e.changed}): lr "
                             f"{_num(e.lr_before, '.3g')} -> {_num(e.lr_after, '.3g')}",
}
_LISTED = ("event", "step", "rank", "ranks", "host", "nodes")


def _detail(event) -> str:
    describe = _DETAIL.get(event.event)
    if describe is not None:
        return describe(event)
    if hasattr(event, "reason"):
        return str(event.reason)
    return ", ".join(f"{k}={v}" for k, v in vars(event).items() if k not in _LISTED)


def _plot_panel(plt, runs: Sequence[RunSeries], panel: Tuple[str, str, str, str], png: str):
    """Draws one panel, saves it; returns the plotted lines as {label: [x, y]}."""
    key, title, ylabel, field_name = panel
    fig, ax = plt.subplots(figsize=(7.5, 3.6), dpi=100)
    plotted: Dict[str, List[list]] = {}
    for i, run in enumerate(runs):
        colour = f"C{i % 10}"
        names = [f"train/{field_name}"] + (["valid/loss", "test/loss"] if key == "loss" else [])
        for series, style in zip(names, ("-", "o--", "*")):
            points = run.series.get(series)
            if not points:
                continue
            label = f"{run.name}: {series}"
            line, = ax.plot([p[0] for p in points], [p[1] for p in points], style,
                            color=colour, label=label, markersize=5 if style != "-" else 0)
            plotted[label] = [[float(x) for x in line.get_xdata()],
                              [float(y) for y in line.get_ydata()]]
    _mark_events(ax, runs)
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if plotted:
        ax.legend(fontsize=7, loc="best")
    else:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return plotted


def _mark_events(ax, runs: Sequence[RunSeries]) -> None:
    seen = set()
    for run in runs:
        for e in run.events:
            colour, style = _EVENT_STYLE.get(e.kind, _DEFAULT_STYLE)
            ax.axvline(e.step, color=colour, linestyle=style, linewidth=1, alpha=0.7,
                       label=None if e.kind in seen else e.kind)
            seen.add(e.kind)


def write_report(run_dirs: Sequence[str], output: str) -> Written:
    """Writes OUTPUT/index.html and OUTPUT/<panel>.png; returns the page's path and the lines
    of metrics.jsonl left out."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("megatron-report needs matplotlib: pip install matplotlib (or pip "
                         "install 'megatron-frontier[report]')") from None
    check_output("--output", output, "dir")  # a folder (new or existing) for the page and PNGs
    seen = {}
    for path in run_dirs:
        real = os.path.realpath(path)
        if real in seen:
            raise InputError(f"run directory {path!r} is given twice (as {seen[real]!r} too): "
                             f"each run is one series in every panel; pass it once")
        seen[real] = path
    runs = _named(run_dirs)
    os.makedirs(output, exist_ok=True)
    plotted, images = {}, {}
    for panel in PANELS:
        png = os.path.join(output, f"{panel[0]}.png")

        def draw(tmp: str, panel=panel) -> None:
            plotted[panel[0]] = _plot_panel(plt, runs, panel, tmp)
        write_whole(png, "a panel of the report", draw)
        with open(png, "rb") as f:
            images[panel[0]] = base64.b64encode(f.read()).decode()
    page = os.path.join(output, "index.html")
    write_text_whole(page, "the report page", _html(runs, plotted, images))
    return Written(page, [line for r in runs for line in r.skipped])


def _named(run_dirs: Sequence[str]) -> List[RunSeries]:
    """Runs named by their folder, or by their path where two folders share a name."""
    bases = [os.path.basename(os.path.normpath(p)) for p in run_dirs]
    return [load_run(p, b if bases.count(b) == 1 else os.path.normpath(p))
            for p, b in zip(run_dirs, bases)]


def _html(runs: Sequence[RunSeries], plotted, images) -> str:
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(r.name)}</td><td>{esc(r.path)}</td><td>{r.last_step}</td>"
        f"<td>{_last(r, 'train/loss')}</td><td>{_last(r, 'valid/loss')}</td>"
        f"<td>{_median(r, 'train/tokens_per_sec')}</td></tr>" for r in runs)
    events = "".join(f"<tr><td>{esc(r.name)}</td><td>{e.step}</td><td>{esc(e.kind)}</td>"
                     f"<td>{esc(e.ranks)}</td><td>{esc(e.nodes)}</td><td>{esc(e.detail)}</td></tr>"
                     for r in runs for e in r.events) or "<tr><td colspan=6>none</td></tr>"
    figures = "".join(f"<figure><img alt='{key}' src='data:image/png;base64,{images[key]}'>"
                      f"<figcaption>{esc(title)}</figcaption></figure>"
                      for key, title, _, _ in PANELS)
    data = json.dumps({"runs": [r.name for r in runs], "panels": plotted}).replace("</", "<\\/")
    return _PAGE.format(title=esc(", ".join(r.name for r in runs)), rows=rows, events=events,
                        skipped=_skipped_html(runs) + _retrained_html(runs) + _moe_html(runs),
                        figures=figures,
                        data=data)


def _load(layer: dict) -> float:
    return layer["tokens_per_expert_max"] / max(layer["tokens_per_expert_mean"], 1e-12)


def moe_rows(run: RunSeries) -> List[Tuple[int, int, float, float, float, float, float, float]]:
    """Per MoE layer: (layer, last step, its load max/mean, the run's largest load max/mean,
    aux loss, z-loss, dropped fraction, tokens per expert mean), from the last logged step."""
    if not run.moe:
        return []
    step, last = run.moe[-1]
    worst = [max(_load(layers[i]) for _, layers in run.moe if i < len(layers))
             for i in range(len(last))]
    return [(i, step, _load(layer), worst[i], layer["aux_loss"], layer["z_loss"],
             layer["dropped_fraction"], layer["tokens_per_expert_mean"])
            for i, layer in enumerate(last)]


def _moe_html(runs: Sequence[RunSeries]) -> str:
    """The expert-load table of MoE runs ("" when no run logged MoE numbers)."""
    rows = "".join(
        f"<tr><td>{html.escape(r.name)}</td><td>{i}</td><td>{step}</td><td>{load:.2f}</td>"
        f"<td>{worst:.2f}</td><td>{aux:.4g}</td><td>{z:.4g}</td><td>{drop:.1%}</td>"
        f"<td>{mean:.1f}</td></tr>"
        for r in runs for i, step, load, worst, aux, z, drop, mean in moe_rows(r))
    if not rows:
        return ""
    return ("<h2>Expert load (MoE)</h2><p>Per MoE layer, the global batch's micro-batches of the "
            "last logged step window: the busiest expert's tokens over the mean (1.00: balanced).</p>"
            "<table><tr><th>run</th><th>MoE layer</th><th>step</th><th>load max/mean</th>"
            "<th>largest in the run</th><th>aux loss</th><th>z-loss</th><th>dropped</th>"
            f"<th>tokens per expert (mean)</th></tr>{rows}</table>")


def _skipped_html(runs: Sequence[RunSeries]) -> str:
    """The lines left out, so a reader of the page knows what it does not show."""
    lines = [line for r in runs for line in r.skipped]
    if not lines:
        return ""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return (f"<h2>Skipped lines</h2><p>{len(lines)} line(s) of metrics.jsonl are not records "
            "and were skipped: a line the run is writing now, or what a crash left (a line cut "
            f"short, zero-filled blocks).</p><ul>{items}</ul>")


def _retrained_html(runs: Sequence[RunSeries]) -> str:
    """The steps a run trained twice, so a reader knows the panels show the second time."""
    items = "".join(f"<li>{html.escape(r.name)}: steps {a}-{b}</li>" for r in runs
                    for a, b in r.retrained)
    if not items:
        return ""
    return ("<h2>Steps trained again</h2><p>These steps were logged, then the run went on from "
            "an earlier checkpoint (a resume after a crash or a stop past the last save, or a "
            "rollback) and trained them again: the panels show the second time, the first is "
            f"left out.</p><ul>{items}</ul>")


def _last(run: RunSeries, series: str) -> str:
    points = run.series.get(series)
    return f"{points[-1][1]:.4f}" if points else "-"


def _median(run: RunSeries, series: str) -> str:
    values = sorted(v for _, v in run.series.get(series, []))
    return f"{values[len(values) // 2]:,.0f}" if values else "-"


_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>megatron-report: {title}</title>
<style>body{{font-family:sans-serif;margin:1.5em;background:#fff;color:#222}}
table{{border-collapse:collapse;margin:.5em 0 1.5em}}
td,th{{border:1px solid #bbb;padding:.2em .6em}}
figure{{display:inline-block;margin:.4em}}img{{max-width:100%}}</style></head>
<body><h1>megatron-report: {title}</h1>
<table><tr><th>run</th><th>path</th><th>last step</th><th>train loss</th><th>valid loss</th>
<th>median tokens/s</th></tr>{rows}</table>
<h2>Events</h2><table><tr><th>run</th><th>step</th><th>event</th><th>rank</th><th>node</th>
<th>detail</th></tr>{events}
</table>{skipped}<h2>Panels</h2>{figures}
<script type="application/json" id="series">{data}</script>
</body></html>
"""
