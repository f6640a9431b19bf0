"""The end-to-end benchmark's JSON and markdown table (rewritten after every run)."""
from __future__ import annotations

import json
from pathlib import Path

LABELS = {"fused": "this project, fused kernels", "torch": "this project, torch kernels",
          "torch_zero0": "this project, torch kernels, ZeRO-0",
          "torch_bf16opt": "this project, torch kernels, fp32 gradients (BF16_Optimizer)",
          "fused_bf16opt": "this project, fused kernels, fp32 gradients (BF16_Optimizer)",
          "peer": "plain PyTorch peer"}


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _tf(value) -> str:
    """TFLOP/s: one decimal on a GPU, three significant digits for a CPU's small numbers."""
    return "-" if value is None else format(value, ".1f" if value >= 10 else ".3g")


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}"


def line(name: str, e: dict) -> str:
    if e["status"] == "skipped":
        return f"e2e {name:<6} skipped: {e['reason']}"
    text = (f"e2e {name:<6} {e['status']:<7} {_num(e.get('tokens_per_s'), '10.0f')} tokens/s "
            f"{_tf(e.get('tflops_per_gpu')):>7} TFLOP/s MFU {_num(e.get('mfu'), '.3f')} "
            f"peak {_num(e.get('peak_mem_gb'), '.2f')} GiB ({e['wall_s']}s)")
    return text + (f"\n    error: {e['error']}" if e.get("error") else "")


def markdown(r: dict) -> str:
    s, d, plan = r["shape"], r["device"], r["planner"]
    runs = r["runs"]
    peer_tps = runs.get("peer", {}).get("tokens_per_s")
    lines = [f"# End-to-end training on {d['name']}{' (tiny dry run)' if r['tiny'] else ''}", "",
             f"GPT {s['layers']} layers, hidden {s['hidden']}, {s['heads']} heads, sequence "
             f"{s['seq']}, vocabulary {s['vocab']}; bf16, one device, ZeRO-1, synthetic tokens; "
             f"micro-batch {s['micro_batch']}, global batch {s['global_batch']} "
             f"({r['tokens_per_step']} tokens a step); median of {r['timed_steps']} steps after "
             f"{r['warmup_steps']} warm-up. torch {d['torch']}, CUDA {d['cuda'] or '-'}, "
             f"DeepSpeed {d['deepspeed'] or '-'}, Python {d['python']}; {r['date']}.", "",
             "| run | attention | tokens/s | TFLOP/s | MFU | peak memory GiB | step s | "
             "x peer | status |", "|---|---|---|---|---|---|---|---|---|"]
    for name, e in runs.items():
        label = LABELS.get(name, name)
        if e["status"] == "skipped":
            lines.append(f"| {label} | - | - | - | - | - | - | - | skipped: {e['reason']} |")
            continue
        lines.append(f"| {label} | {e.get('attention') or '-'} | "
                     f"{_num(e.get('tokens_per_s'), '.0f')} | "
                     f"{_tf(e.get('tflops_per_gpu'))} | {_num(e.get('mfu'), '.3f')} | "
                     f"{_num(e.get('peak_mem_gb'), '.2f')} | {_num(e.get('step_time_s'), '.3f')} "
                     f"| {_ratio(e.get('tokens_per_s'), peer_tps)} | {e['status']} |")
    if "error" in plan:
        lines.append(f"| planner prediction | - | - | - | - | - | - | - | {plan['error']} |")
    else:
        lines.append(f"| planner prediction ({plan['profile']}) | flash/SDPA | "
                     f"{plan['tokens_per_s']:.0f} | {_tf(plan['tflops_per_gpu'])} | "
                     f"{plan['mfu']:.3f} | {plan['peak_mem_gb']:.2f} | {plan['step_time_s']:.3f} "
                     f"| {_ratio(plan['tokens_per_s'], peer_tps)} | {plan['layout']} |")
    lines += ["", "Measured against the planner (measured / predicted):", ""]
    for name in ("fused", "torch"):
        e = runs.get(name, {})
        if e.get("tokens_per_s") and "error" not in plan:
            memory = _ratio(e.get("peak_mem_gb"), plan["peak_mem_gb"])
            lines.append(f"- {LABELS[name]}: peak memory {memory}, step time "
                         f"{_ratio(e['step_time_s'], plan['step_time_s'])}")
    lines += ["", "TFLOP/s are model FLOPs (megatron.training.metrics.model_flops_per_token, the "
              "trainer's formula) over the median step time; MFU divides by "
              f"{d['peak_tflops'] or 'no known'} TFLOP/s, the device's dense bf16 peak. Peak "
              "memory is torch.cuda.max_memory_allocated (the resident set on a CPU); the "
              "planner's is the allocator peak it predicts for the same layout.", ""]
    for name, e in runs.items():
        if e.get("precision_policy"):
            lines.append(f"- {LABELS.get(name, name)}: {e['precision_policy']}.")
        if e.get("context"):
            lines.append(f"- {LABELS.get(name, name)} ran with: {e['context']}.")
        if e.get("error"):
            lines.append(f"- {LABELS.get(name, name)} error: {e['error']}")
    return "\n".join(lines) + "\n"


def write(stem: Path, result: dict) -> None:
    Path(f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    Path(f"{stem}.md").write_text(markdown(result))
