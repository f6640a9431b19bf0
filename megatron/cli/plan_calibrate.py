"""megatron-plan calibrate: real trials on this machine, a fitted profile, the ranking check."""
from __future__ import annotations

import dataclasses
import logging
import os

from megatron.base.outputs import check_output
from megatron.cli.plan_args import load_job, load_space
from megatron.config.errors import ConfigError, InputError
from megatron.planner import emit
from megatron.planner.calibrate import calibrate, calibration_layouts, job_note
from megatron.planner.profile import Constants, Profile, load_profile
from megatron.planner.trials import TorchrunRunner, TrialStore, run_trials

log = logging.getLogger("megatron.cli.plan")


def base_profile(args) -> Profile:
    """The profile to refine, with one node of --nproc devices (the machine at hand)."""
    if args.cluster:
        prof = load_profile(args.cluster)
    else:
        from megatron.planner.probe import probe_local
        # A CPU reports peak resident memory, which sees only the pages of DeepSpeed's gradient
        # bucket that gradients touch (Constants.bucket_touched).
        prof = Profile(probe_local(args.nproc), Constants(bucket_touched=1.0))
        log.info("probed this machine: %.3g TFLOPs per rank, %.3g GB/s memory, %.3g GB per rank",
                 prof.spec.peak_tflops, prof.spec.hbm_gbps, prof.spec.gpu_memory_gb)
    return Profile(dataclasses.replace(prof.spec, gpus_per_node=args.nproc), prof.constants)


def run_calibrate(args) -> int:
    if not args.config:
        raise InputError("calibrate trains real models: pass --config FILE.yaml "
                         "(for example examples/local/tiny.yaml)")
    if args.nproc < 1 or args.trials < 0:
        raise ConfigError("--nproc/--trials", (args.nproc, args.trials), "positive integers")
    if args.warmup >= args.steps:
        raise ConfigError("--warmup", args.warmup, f"fewer steps than --steps ({args.steps}): "
                          "the steps after the warm-up are the ones timed")
    # written after minutes or hours of trials: checked first (--fit-only only reads --results)
    runs = not args.fit_only and args.trials
    if runs:
        check_output("--results", args.results, "file")
        check_output("--run-root", args.run_root, "dir")
    check_output("--out", args.out, "file")
    if os.path.realpath(args.out) == os.path.realpath(args.results):
        raise InputError(f"--out: {args.out!r} is --results's file too: expected another file "
                         "(the profile would overwrite the trials); give each its own path")
    if args.fit_only and not os.path.isfile(args.results):
        raise InputError(f"--fit-only fits the trials stored in --results, and there is no file "
                         f"{args.results!r}: pass the results file of earlier trials, or drop "
                         "--fit-only to run trials")
    job, _, _ = load_job(args)
    prof = base_profile(args)
    space = load_space(args)
    store = TrialStore(args.results)
    note = job_note(job)
    runner = TorchrunRunner(args.config, job, args.nproc, args.run_root, steps=args.steps,
                            overrides=args.set, timeout_s=args.timeout, warmup=args.warmup,
                            flash_backend=args.flash_backend, job_note=note)
    if runs:
        if args.bayes:
            from megatron.planner.bayes import bayes_search
            bayes_search(job, prof, runner, store, args.trials, space)
        else:
            run_trials(runner, calibration_layouts(job, prof, space, args.trials), store)
    trials = [t for t in store.load().values() if t.job in ("", note)]
    failed = [t for t in trials if not t.ok]
    for t in failed:
        log.warning("trial %s %s: %s", t.key, t.status, t.error.strip().splitlines()[-1:] or "")
    fitted, report = calibrate(job, prof, trials)
    fitted.save(args.out)
    _print_report(report, args.out, len(failed))
    return 0


def _print_report(report, out: str, failed: int) -> None:
    header = ("layout", "measured s", "before s", "fitted s", "measured GB", "fitted GB")
    rows = [[r["key"], f"{r['measured_s']:.3g}", f"{r['predicted_before_s']:.3g}",
             f"{r['predicted_after_s']:.3g}",
             "-" if r["mem_gb"] is None else f"{r['mem_gb']:.2f}", f"{r['predicted_mem_gb']:.2f}"]
            for r in sorted(report.rows, key=lambda r: r["measured_s"])]
    print(emit.format_table(header, rows))
    c = report.constants
    print(f"\n{report.trials} trials ({failed} failed); relative error of step time "
          f"{100 * report.rel_rmse_before:.0f}% before, {100 * report.rel_rmse_after:.0f}% after "
          f"fitting; Spearman rank correlation {report.spearman:.2f}")
    print(f"fitted: gemm_eff {c.gemm_eff:.3g}, gemm_half_dim {c.gemm_half_dim:g}, hbm_eff "
          f"{c.hbm_eff:.3g}, links in a node: comm_eff {c.comm_eff:.3g}, latency "
          f"x{c.latency_scale:.3g}; across nodes: comm_eff {c.inter_comm_eff:.3g}, latency "
          f"x{c.inter_latency_scale:.3g}; "
          f"micro-batch overhead "
          f"{c.microbatch_overhead_s * 1e3:.3g} ms (+{100 * c.pipe_engine_share:.3g}% per pipeline "
          f"slot and {c.pipe_layer_s * 1e3:.3g} ms per layer of it, held at the profile's), "
          f"step overhead {c.step_overhead_s:.3g} s, "
          f"act_scale {c.act_scale:.3g}, fixed {c.fixed_gb:.3g} GB")
    print(f"wrote {out} (use it with --cluster {out})")
