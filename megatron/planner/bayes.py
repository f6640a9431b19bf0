"""Bayesian optimisation over real trials (Optuna's TPE sampler), as the paper used DeepHyper.

The study maximises measured tokens per second over TP, PP, micro-batch, ZeRO stage, recompute,
attention path and sequence parallelism. It is seeded with the planner's best predictions, so
the budget goes first to the layouts the model rates highest; then TPE proposes. Combinations
the trainer would refuse or the model says cannot fit are told to the study as pruned without
spending budget. Stored trials (JSON lines) are replayed into the study, so a search resumes."""
from __future__ import annotations

import logging
from typing import Dict, List, Optional

from megatron.config.errors import InputError
from megatron.planner.layout import Job, Layout, layout_problem
from megatron.planner.search import SearchSpace, enumerate_layouts, evaluate, search
from megatron.planner.profile import Profile
from megatron.planner.trials import TrialResult, TrialStore

log = logging.getLogger(__name__)

_KNOBS = ("tp", "pp", "micro_batch", "zero", "recompute", "flash", "sequence_parallel")


def _choices(job: Job, world: int, gpus_per_node: int, space: SearchSpace,
             framework: str = "deepspeed") -> Dict[str, List]:
    seen: Dict[str, set] = {k: set() for k in _KNOBS}
    for lay in enumerate_layouts(job, world, gpus_per_node, space, framework):
        for k in _KNOBS:
            seen[k].add(getattr(lay, k))
    return {k: sorted(v, key=str) for k, v in seen.items()}


def _layout_of(params: Dict, job: Job, world: int) -> Optional[Layout]:
    tp, pp, mb = params["tp"], params["pp"], params["micro_batch"]
    if world % (tp * pp):
        return None
    dp = world // (tp * pp)
    if job.global_batch % (mb * dp):
        return None
    return Layout(tp, pp, dp, mb, job.global_batch // (mb * dp), params["zero"],
                  params["recompute"], params["flash"], params["sequence_parallel"])


def _objective(job: Job, rec: TrialResult) -> float:
    """Measured tokens per second, from the step time (every trial has one)."""
    return job.global_batch * job.seq / rec.step_time_s


def _params_of(lay: Layout) -> Dict:
    return {k: getattr(lay, k) for k in _KNOBS}


def bayes_search(job: Job, prof: Profile, runner, store: TrialStore, budget: int,
                 space: SearchSpace = SearchSpace(), seed: int = 0, seed_top: int = 3,
                 max_asks: Optional[int] = None) -> List[TrialResult]:
    """Runs up to `budget` new trials; returns every measured trial, best first."""
    try:
        import optuna  # imported here: only this mode needs it, and it takes a second to load
    except ImportError:
        raise InputError("Bayesian optimisation needs optuna: pip install "
                         "'megatron-frontier[plan]' (or leave out --bayes)") from None

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    world = prof.spec.gpus_per_node  # one node: the machine at hand
    choices = _choices(job, world, prof.spec.gpus_per_node, space, prof.spec.framework)
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in choices.items()}
    study = optuna.create_study(direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=3))
    done = store.load()
    for rec in done.values():
        state = optuna.trial.TrialState.COMPLETE if rec.ok else optuna.trial.TrialState.FAIL
        study.add_trial(optuna.trial.create_trial(
            params=_params_of(rec.to_layout()), distributions=dists, state=state,
            value=_objective(job, rec) if rec.ok else None))
    for cand in search(job, 1, prof, space).ranked[:seed_top]:
        if cand.layout.key() not in done:
            study.enqueue_trial(_params_of(cand.layout))
    spent, asks = 0, 0
    max_asks = max_asks or 50 * max(budget, 1)
    while spent < budget and asks < max_asks:
        asks += 1
        trial = study.ask(dists)
        lay = _layout_of(trial.params, job, world)
        if (lay is None or layout_problem(job, lay, prof.spec.framework)
                or not evaluate(job, lay, prof, space, False).fits):
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            continue
        rec = done.get(lay.key())
        if rec is None:
            rec = runner.run(lay)
            store.append(rec)
            done[rec.key] = rec
            spent += 1
            log.info("trial %d/%d %s: %s", spent, budget, lay.key(), rec.status)
        if rec.ok:
            study.tell(trial, _objective(job, rec))
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    measured = [r for r in done.values() if r.ok]
    return sorted(measured, key=lambda r: r.step_time_s)
