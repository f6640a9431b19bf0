"""Shared by the data benchmarks: machine description and the results files
(benchmarks/results/data.json, one section per benchmark, and data.md rendered from it)."""
from __future__ import annotations

import json
import os
import platform
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
JSON_PATH = os.path.join(RESULTS, "data.json")
MD_PATH = os.path.join(RESULTS, "data.md")


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    try:
        mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    except (ValueError, OSError):
        mem_gb = None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem_gb, 1) if mem_gb else None,
            "python": platform.python_version(), "numpy": np.__version__,
            "os": platform.platform(), "load_average_at_start": list(os.getloadavg()),
            "date": time.strftime("%Y-%m-%d %H:%M")}


def save(section: str, data: dict, machine_at_start: dict) -> None:
    """machine_at_start: machine() taken before the measurements (its load average)."""
    os.makedirs(RESULTS, exist_ok=True)
    try:
        with open(JSON_PATH) as f:
            results = json.load(f)
    except (OSError, ValueError):
        results = {}
    results[section] = {"machine": machine_at_start, **data}
    with open(JSON_PATH, "w") as f:
        json.dump(results, f, indent=1)
    with open(MD_PATH, "w") as f:
        f.write(render(results))


def render(results: dict) -> str:
    out = ["# Data pipeline benchmarks", "",
           "Written by `benchmarks/data/*.py` (see the README there) from `data.json`.", ""]
    pre = results.get("preprocess")
    if pre:
        m = pre["machine"]
        out += ["## Preprocessing throughput (`megatron-preprocess`)", "",
                f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GiB, "
                f"Python {m['python']}; load average at start {m['load_average_at_start'][0]:.1f}"
                f" ({m['date']}). Corpus: {pre['corpus']}.", "",
                "| tokenizer | workers | documents | MB | wall s | CPU s | MB/s | docs/s "
                "| tokens/s | MB per CPU s |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in pre["runs"]:
            out.append(f"| {r['tokenizer']} | {r['workers']} | {r['documents']:,} | "
                       f"{r['mb']:.1f} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} | "
                       f"{r['mb_per_s']:.2f} | "
                       f"{r['docs_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | "
                       f"{r['mb'] / max(r['cpu_seconds'], 1e-9):.2f} |")
        out += [""] + [f"- {n}" for n in pre.get("notes", [])] + [""]
    idx = results.get("index")
    if idx:
        m = idx["machine"]
        out += ["## GPT index build: C++ helper vs NumPy", "",
                f"Machine: {m['cpu']}, {m['cores']} cores; load average at start "
                f"{m['load_average_at_start'][0]:.1f} ({m['date']}). {idx['setup']}", "",
                "| what | C++ s | NumPy s | NumPy / C++ | identical |", "|---|---|---|---|---|"]
        for r in idx["runs"]:
            out.append(f"| {r['what']} | {r['cpp_s']:.3f} | {r['numpy_s']:.3f} | "
                       f"{r['numpy_s'] / max(r['cpp_s'], 1e-9):.1f}x | {r['identical']} |")
        out += [""] + [f"- {n}" for n in idx.get("notes", [])] + [""]
    return "\n".join(out)
