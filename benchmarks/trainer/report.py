"""Summaries (median and range over rounds) and the markdown tables of bench_trainer.py."""
from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Dict, List


def spread(values: List[float]) -> Dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def single_summary(rounds: List[dict], programs, peers) -> dict:
    summary = {}
    for p in programs:
        summary[p] = {key: spread([r[p][key] for r in rounds])
                      for key in ("tokens_per_s", "cpu_tokens_per_s", "launch_to_first_step_s")
                      if all(key in r[p] for r in rounds)}
    ratios = {}
    for clock, key in (("wall", "tokens_per_s"), ("cpu", "cpu_tokens_per_s")):
        for peer in peers:
            ratios.setdefault(peer, {})[clock] = spread(
                [r["megatron"][key] / r[peer][key] for r in rounds])
        ratios.setdefault("faster_peer", {})[clock] = spread(
            [r["megatron"][key] / max(r[p][key] for p in peers) for r in rounds])
        # Other work only ever slows a run down: each program's best round is the closest to a
        # quiet machine.
        best = {p: max(r[p][key] for r in rounds) for p in programs}
        for peer in peers:
            ratios[peer][clock]["best_rounds"] = best["megatron"] / best[peer]
        ratios["faster_peer"][clock]["best_rounds"] = best["megatron"] / max(best[p]
                                                                             for p in peers)
    return {"summary": summary, "ratios": ratios}


def baseline_of(layout: str) -> str:
    """The one-process run a layout is compared with: single, or single_<suffix>."""
    _, _, suffix = layout.partition("_")
    return f"single_{suffix}" if suffix else "single"


def layout_summary(rounds: List[dict], names) -> dict:
    summary = {n: {key: spread([r[n][key] for r in rounds])
                   for key in ("tokens_per_s", "cpu_tokens_per_s", "median_iteration_s")}
               for n in names}
    efficiency = {n: spread([r[n]["tokens_per_s"] / (r[n]["layout"]["world"] *
                                                     r[baseline_of(n)]["tokens_per_s"])
                             for r in rounds]) for n in names if not n.startswith("single")}
    # Other work on the machine only ever slows a run down: the best round of each layout is the
    # closest to a quiet machine.
    best = {n: max(r[n]["tokens_per_s"] for r in rounds) for n in names}
    for n in efficiency:
        efficiency[n]["best_rounds"] = best[n] / (rounds[0][n]["layout"]["world"] *
                                                  best[baseline_of(n)])
    return {"summary": summary, "efficiency": efficiency,
            "layouts": {n: rounds[0][n]["layout"] for n in names}}


def startup_summary(runs: List[dict]) -> dict:
    names = []
    for run in runs:
        names += [n for n in run["phases"] if n not in names]
    return {"launch_to_first_step_s": spread([r["launch_to_first_step_s"] for r in runs]),
            "rank0_process_to_first_step_s": spread(
                [r["rank0_process_to_first_step_s"] for r in runs]),
            # /proc gives the process's launch to 10 ms: a single process shows about 0 here.
            "launcher_s": spread([max(0.0, r["launch_to_first_step_s"] -
                                      r["rank0_process_to_first_step_s"]) for r in runs]),
            "first_step_s": spread([r["first_step_s"] for r in runs]),
            "phases": {n: statistics.median([r["phases"].get(n, 0.0) for r in runs])
                       for n in names},
            "runs": runs}


def _range(s: Dict[str, float], fmt: str = "{:.0f}") -> str:
    if s["n"] == 1:
        return fmt.format(s["median"])
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"


def _when(section: dict) -> str:
    """Run date and the 1-minute load average before and after the section (2 cores: above 2,
    other work shared the machine)."""
    if "load_average" not in section:
        return ""
    return (f"Run {section['date']}; load average {section['load_average'][0]:.1f} before, "
            f"{section['load_average'][1]:.1f} after. ")


def _single_md(single: dict) -> List[str]:
    sh = single["shape"]
    lines = [f"## One process: {sh['layers']} layers, hidden {sh['hidden']}, {sh['heads']} heads, "
             f"sequence {sh['seq']}, vocabulary {sh['vocab']}, batch {sh['batch']}",
             "", f"{_when(single)}"
             f"{len(single['rounds'])} rounds, alternating; per run {single['warmup_steps']} "
             f"warm-up + {single['timed_steps']} timed steps; median (min-max) over rounds.", "",
             "| program | tokens/s (wall) | tokens/s (CPU time) | launch to first step, s |",
             "|---|---|---|---|"]
    for p, s in single["summary"].items():
        first = _range(s["launch_to_first_step_s"], "{:.2f}") \
            if "launch_to_first_step_s" in s else "-"
        lines.append(f"| {p} | {_range(s['tokens_per_s'])} | {_range(s['cpu_tokens_per_s'])} "
                     f"| {first} |")
    lines += ["", "| trainer / peer | wall, same round | CPU time, same round | wall, best "
              "rounds | CPU time, best rounds |", "|---|---|---|---|---|"]
    for peer, r in single["ratios"].items():
        best = [f"{r[c]['best_rounds']:.3f}" if "best_rounds" in r[c] else "-"
                for c in ("wall", "cpu")]
        lines.append(f"| {peer.replace('_', ' ')} | {_range(r['wall'], '{:.3f}')} "
                     f"| {_range(r['cpu'], '{:.3f}')} | {best[0]} | {best[1]} |")
    return lines + [""]


def _layouts_md(layouts: dict) -> List[str]:
    lines = [f"## Layouts of {layouts['config']}, one thread per rank", "",
             f"{_when(layouts)}{len(layouts['rounds'])} rounds; "
             f"{layouts['warmup_steps']} warm-up + {layouts['timed_steps']} timed steps; "
             "efficiency = tokens/s of the ranks / (ranks x tokens/s of one process of the same "
             "ZeRO stage) in the same round; of best rounds: the same from each layout's fastest "
             "round (other work only slows runs down).", "",
             "| layout | ranks | tokens/s | step, ms | efficiency | efficiency of best rounds |",
             "|---|---|---|---|---|---|"]
    for name, s in layouts["summary"].items():
        ranks = layouts["layouts"][name]["world"]
        e = layouts["efficiency"].get(name)
        eff, best = ("-", "-") if not e else (_range(e, "{:.2f}"), f"{e['best_rounds']:.2f}")
        ms = {k: v * 1000 if k != "n" else v for k, v in s["median_iteration_s"].items()}
        lines.append(f"| {name} | {ranks} | {_range(s['tokens_per_s'])} | {_range(ms, '{:.1f}')} "
                     f"| {eff} | {best} |")
    return lines + [""]


def _startup_md(startup: dict) -> List[str]:
    lines = [f"## Start-up to the first step ({startup['config']}, megatron-train)", "",
             _when(startup), ""]
    for ranks, case in startup["cases"].items():
        sec = {k: _range(v, "{:.2f}") for k, v in case.items()
               if isinstance(v, dict) and "median" in v}
        lines += [f"{case.get('ranks', ranks)} rank(s), {case.get('variant', 'megatron-train')}: "
                  f"launch to first step {sec['launch_to_first_step_s']} s "
                  f"(rank 0's process {sec['rank0_process_to_first_step_s']} s, launcher "
                  f"{sec['launcher_s']} s); first step {sec['first_step_s']} s", "",
                  "| phase (rank 0, median) | s |", "|---|---|"]
        lines += [f"| {n} | {s:.2f} |" for n, s in case["phases"].items() if s >= 0.005]
        lines.append("")
    return lines


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"# Trainer overhead ({result['date']}{', --tiny' if result['tiny'] else ''})", "",
             f"{m['cpu']}, {m['cores']} cores; torch {m['torch']}, deepspeed {m['deepspeed']}, "
             f"transformers {m['transformers']}; one thread per process.", ""]
    if "single" in result:
        lines += _single_md(result["single"])
    if "layouts" in result:
        lines += _layouts_md(result["layouts"])
    if "startup" in result:
        lines += _startup_md(result["startup"])
    return "\n".join(lines)


def write(result: dict, out_dir: Path, name: str) -> None:
    for suffix, text in ((".json", json.dumps(result, indent=1)),
                         ("_tables.md", markdown(result))):
        path = out_dir / f"{name}{suffix}"
        with open(str(path) + ".tmp", "w") as f:
            f.write(text + "\n")
        os.replace(str(path) + ".tmp", path)
