"""The training state's invariants (training/state_check.py, resilience.check_state): the bound
on AdamW's moments against a hand calculation and against torch's AdamW driven by gradient
sequences chosen to come close to it, the moment check on a corrupted state, and who is named
among replicas that disagree."""
import math

import pytest
import torch

from megatron.base import faults
from megatron.training.state_check import (ABS_TOL, adam_bound, checksum, judge,
                                           moment_excess)


def test_the_bound_matches_a_hand_calculation():
    # b1 0.9, b2 0.95: (0.1)^2 / (0.05 * (1 - 0.81 / 0.95)) = 0.01 / (0.05 * 0.147368...) = 1.3571
    assert adam_bound(0.9, 0.95) == pytest.approx(0.01 / (0.05 * (1 - 0.81 / 0.95)), rel=1e-12)
    assert adam_bound(0.9, 0.95) == pytest.approx(1.357142857, rel=1e-9)
    assert adam_bound(0.9, 0.999) == pytest.approx(0.01 / (0.001 * (1 - 0.81 / 0.999)))
    assert adam_bound(0.95, 0.9) is None  # b1^2 >= b2: no bound
    assert adam_bound(0.0, 0.5) == pytest.approx(2.0)  # m = g, v = 0.5 g^2: m^2 = 2 v exactly


def _adam(shape, betas, grads, dtype=torch.float32):
    p = torch.nn.Parameter(torch.zeros(shape, dtype=dtype))
    opt = torch.optim.AdamW([p], lr=1e-3, betas=betas, foreach=True)
    for g in grads:
        p.grad = g.to(dtype)
        opt.step()
    return opt


@pytest.mark.parametrize("betas", [(0.9, 0.95), (0.9, 0.999), (0.8, 0.7)])
def test_healthy_moments_stay_inside_the_bound_even_for_gradients_chosen_to_reach_it(betas):
    torch.manual_seed(0)
    b1, b2 = betas
    n = 60
    # The Cauchy-Schwarz bound is reached by |g_{t-k}| proportional to (b1 / b2)^k (k steps
    # back): grown geometrically toward the last step, in every sign pattern and scale
    ramp = torch.tensor([(b1 / b2) ** (n - 1 - i) for i in range(n)])
    grads = [(ramp[i] * torch.tensor([1.0, -1.0, 1e-12, 1e12, 3.0])) for i in range(n)]
    random = [torch.randn(5) * 10 ** float(torch.randint(-6, 6, ())) for _ in range(n)]
    for seq in (grads, random, [torch.full((5,), 2.0)] * n):
        opt = _adam((5,), betas, seq)
        assert moment_excess(opt) <= ABS_TOL, betas
        st = opt.state[opt.param_groups[0]["params"][0]]
        ratio = (st["exp_avg"] ** 2 / st["exp_avg_sq"]).max().item()
        assert ratio <= adam_bound(*betas) * (1 + 1e-6)
    # the ramp comes within a few percent of the bound: the check has no slack to hide in
    opt = _adam((5,), betas, grads)
    st = opt.state[opt.param_groups[0]["params"][0]]
    ratio = (st["exp_avg"][:2] ** 2 / st["exp_avg_sq"][:2]).max().item()
    assert ratio > 0.9 * adam_bound(*betas), (ratio, adam_bound(*betas))


@pytest.mark.parametrize("target, factor", [("exp_avg", 1e20), ("exp_avg", -1e20),
                                            ("exp_avg", math.inf), ("exp_avg_sq", 1e-20),
                                            ("exp_avg_sq", -1.0), ("exp_avg_sq", math.nan)])
def test_a_corrupted_moment_breaks_the_bound(target, factor):
    torch.manual_seed(1)
    opt = _adam((300,), (0.9, 0.95), [torch.randn(300) for _ in range(4)])
    assert moment_excess(opt) <= ABS_TOL
    state = opt.state[opt.param_groups[0]["params"][0]]
    faults.scale_largest([state[target]], factor)
    assert not moment_excess(opt) <= ABS_TOL, (target, factor)


def test_a_larger_second_moment_passes_it_only_slows_that_weight():
    opt = _adam((300,), (0.9, 0.95), [torch.randn(300) for _ in range(4)])
    faults.scale_largest([opt.state[opt.param_groups[0]["params"][0]]["exp_avg_sq"]], 1e20)
    assert moment_excess(opt) <= ABS_TOL


def test_a_state_larger_than_a_chunk_is_checked_in_pieces(monkeypatch):
    from megatron.training import state_check
    monkeypatch.setattr(state_check, "CHUNK", 7)
    opt = _adam((5, 9), (0.9, 0.95), [torch.randn(5, 9) for _ in range(3)])
    assert moment_excess(opt) <= ABS_TOL
    state = opt.state[opt.param_groups[0]["params"][0]]
    state["exp_avg"].view(-1)[44] = 1e10  # the last element: the last piece
    assert moment_excess(opt) > 1e19


def test_pieces_keep_each_batch_within_a_chunk_and_pass_small_tensors_whole(monkeypatch):
    """A tensor within a chunk joins a batch as it is (the same object, its own shape: no
    reshape or split a step); a larger one is split; no batch passes the chunk."""
    from megatron.training import state_check
    monkeypatch.setattr(state_check, "CHUNK", 7)
    tensors = [torch.zeros(5), torch.zeros(3, 2), torch.zeros(16), torch.zeros(1)]
    batches = list(state_check._chunks([(t, t + 1) for t in tensors]))
    assert [[m.numel() for m in ms] for ms, _ in batches] == [[5], [6], [7], [7], [2, 1]]
    assert batches[0][0][0] is tensors[0] and batches[1][0][0] is tensors[1]
    assert batches[1][0][0].shape == (3, 2) and batches[4][0][1] is tensors[3]
    assert all(len(ms) == len(vs) for ms, vs in batches)


@pytest.mark.parametrize("target, factor", [("exp_avg", 1e20), ("exp_avg_sq", -1.0),
                                            ("exp_avg_sq", math.nan)])
def test_one_piece_and_a_batch_of_pieces_give_the_same_excess(target, factor):
    """A flat state is checked a piece at a time (v - m^2/limit and its minimum), several small
    tensors as one foreach batch (m^2 - limit v and its maximum): the same figure, healthy or
    broken, whichever tensor is corrupted."""
    from megatron.training.state_check import _excess
    torch.manual_seed(3)
    opts = [_adam((40,), (0.9, 0.95), [torch.randn(40) for _ in range(4)]) for _ in range(2)]
    ms = [o.state[o.param_groups[0]["params"][0]]["exp_avg"] for o in opts]
    vs = [o.state[o.param_groups[0]["params"][0]]["exp_avg_sq"] for o in opts]
    limit = adam_bound(0.9, 0.95) * 1.001
    healthy = torch.stack(_excess(ms, vs, limit)).max()
    singles = torch.stack([_excess([m], [v], limit)[0] for m, v in zip(ms, vs)]).max()
    assert healthy <= ABS_TOL and singles <= ABS_TOL
    assert singles.item() == pytest.approx(healthy.item(), rel=1e-5, abs=1e-12)
    faults.scale_largest([opts[1].state[opts[1].param_groups[0]["params"][0]][target]], factor)
    batch = torch.stack(_excess(ms, vs, limit)).max()
    singles = torch.stack([_excess([m], [v], limit)[0] for m, v in zip(ms, vs)]).max()
    assert not batch <= ABS_TOL and not singles <= ABS_TOL, (batch, singles)


def test_groups_without_a_bound_and_an_empty_state_are_left_out():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p], betas=(0.99, 0.9))
    assert moment_excess(opt) == -math.inf  # no state yet
    p.grad = torch.ones(3)
    opt.step()
    assert moment_excess(opt) == -math.inf  # b1^2 >= b2: nothing to check


def test_checksums_are_bitwise_on_equal_weights_and_differ_on_a_flip():
    torch.manual_seed(2)
    a = [torch.randn(10, 10), torch.randn(7)]
    b = [t.clone() for t in a]
    assert checksum(a) == checksum(b)
    b[1][3] *= 2.0 ** 40
    assert checksum(a) != checksum(b)
    assert checksum([]) == 0.0


def _row(excess=-1.0, total=5.0, group=0.0):
    return [excess, total, group]


def test_judge_names_the_odd_replica_out_and_a_broken_moment():
    assert judge([_row(), _row(), _row(), _row()]) == []
    found = judge([_row(), _row(), _row(total=6.0), _row()])
    assert [(f.rank, f.known) for f in found] == [(2, True)]
    assert "checksum 6.0 differs from its 3 replica(s)'" in found[0].what
    found = judge([_row(excess=1e30), _row(), _row(), _row()])
    assert [(f.rank, f.known) for f in found] == [(0, True)]
    assert "Adam moments" in found[0].what
    found = judge([_row(excess=math.nan, total=math.nan, group=math.nan)])  # one rank, NaN
    assert [(f.rank, f.known) for f in found] == [(0, True)]


def test_judge_compares_each_replica_group_on_its_own_and_names_both_of_two_that_disagree():
    # two groups of two (ids 0 and 1, e.g. TP2 x DP2): group 1's ranks disagree
    rows = [_row(total=1.0, group=0.0), _row(total=2.0, group=1.0),
            _row(total=1.0, group=0.0), _row(total=3.0, group=1.0)]
    found = judge(rows)
    assert [(f.rank, f.known) for f in found] == [(1, False), (3, False)]
    # not replicas (ZeRO-3): the checksums are not compared
    assert judge([_row(total=1.0, group=math.nan), _row(total=2.0, group=math.nan)]) == []
    # a NaN checksum differs from every other
    found = judge([_row(total=math.nan), _row(), _row()])
    assert [(f.rank, f.known) for f in found] == [(0, True)]


def test_the_fault_hook_reads_its_variable_and_refuses_bad_values():
    env = {faults.STATE_FAULT_VAR: "1:3:exp_avg:1e20"}
    assert faults.state_fault(0, env) is None
    assert faults.state_fault(1, env) == faults.StateFault(3, "exp_avg", 1e20)
    assert faults.state_fault(1, {}) is None
    with pytest.raises(ValueError, match="RANK:STEP:TARGET:FACTOR"):
        faults.state_fault(1, {faults.STATE_FAULT_VAR: "1:3:1e20"})
    with pytest.raises(ValueError, match="TARGET 'weights' is not one of"):
        faults.state_fault(1, {faults.STATE_FAULT_VAR: "1:3:weights:2"})
