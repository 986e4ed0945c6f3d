"""The gate, memloop's one decision rule: each verdict pinned on constructed differences, with
its p-values computed here by hand, and its false accepts under no effect measured."""

from __future__ import annotations

import numpy as np
import pytest

from memloop.core.stats import Verdict, gate, gate_of, min_users, sign_flip_p


@pytest.mark.parametrize(
    ("level", "users"),
    [(0.05, 6), (0.05 / 2, 7), (0.05 / 3, 7), (0.05 / 5, 8), (0.01, 8), (0.5, 2)],
)
def test_min_users_is_the_first_n_whose_best_p_reaches_the_level(level, users):
    # n users all moving one way: 2 of the 2^n sign patterns are as extreme, p = 2^(1-n)
    assert 2.0 ** (1 - users) <= level < 2.0 ** (2 - users) or users == 2
    assert min_users(level) == users


def test_improved_needs_the_exact_p_at_the_level():
    # six users all up: p = 2/64 = 0.03125 <= 0.05
    result = gate([0.1, 0.2, 0.05, 0.1, 0.3, 0.15])
    assert result.verdict is Verdict.IMPROVED
    assert result.paired.sign_flip_p == pytest.approx(2 / 64)
    assert result.paired.n == 6 and result.paired.up == 6
    # the same six chosen among three candidates: level 0.0167 < 0.03125
    assert gate([0.1, 0.2, 0.05, 0.1, 0.3, 0.15], comparisons=3).verdict is Verdict.TOO_FEW
    # seven among three: p = 2/128 = 0.0156 <= 0.0167
    chosen = gate([0.1, 0.2, 0.05, 0.1, 0.3, 0.15, 0.1], comparisons=3)
    assert chosen.verdict is Verdict.IMPROVED
    assert chosen.level == pytest.approx(0.05 / 3)


def test_degraded_is_the_mirror():
    result = gate([-0.1, -0.2, -0.05, -0.1, -0.3, -0.15])
    assert result.verdict is Verdict.DEGRADED
    assert result.paired.mean == pytest.approx(-0.15)


def test_better_on_one_pair_only_is_not_improved():
    # ten users, one of them up by one pair of 8 (0.125), the rest tied: p = 1
    result = gate([0.125] + [0.0] * 9)
    assert result.verdict is Verdict.INCONCLUSIVE
    assert result.paired.sign_flip_p == 1.0
    assert (result.paired.up, result.paired.tied, result.paired.down) == (1, 9, 0)


def test_too_few_users_whatever_the_differences():
    # four users, all far up: the best p is 2/16 = 0.125
    result = gate([0.5, 0.5, 0.5, 0.5])
    assert result.verdict is Verdict.TOO_FEW
    assert result.min_users == 6
    assert "needs 6" in str(result)
    assert gate([]).verdict is Verdict.TOO_FEW


def test_mixed_differences_are_inconclusive_with_the_p_of_enumeration():
    diffs = [0.2, -0.1, 0.1, 0.3, -0.2, 0.1, 0.0, 0.1]
    result = gate(diffs)
    # by hand: 7 non-zero differences, 128 patterns; |sum| >= 0.5
    values = [d for d in diffs if d]
    sums = [sum(v if (mask >> i) & 1 else -v for i, v in enumerate(values)) for mask in range(128)]
    p = sum(abs(s) >= 0.5 - 1e-9 for s in sums) / 128
    assert result.paired.sign_flip_p == pytest.approx(p)
    assert p > 0.05
    assert result.verdict is Verdict.INCONCLUSIVE


def test_not_worse_with_a_margin():
    diffs = [0.01, -0.02, 0.0, 0.01, -0.01, 0.02, 0.0, -0.01]
    plain = gate(diffs)
    assert plain.verdict is Verdict.INCONCLUSIVE and plain.p_not_worse is None
    result = gate(diffs, margin=0.1)
    # every diff + 0.1 is positive: the one-sided p is 1/2^8
    assert result.p_not_worse == pytest.approx(1 / 256)
    assert result.verdict is Verdict.NOT_WORSE
    # a margin smaller than the losses: not shown
    assert gate(diffs, margin=0.005).verdict is Verdict.INCONCLUSIVE
    with pytest.raises(ValueError, match="margin"):
        gate(diffs, margin=0.0)


def test_one_sided_sign_flip_by_hand():
    # [1, 1, 1]: 1 of the 8 patterns has sum >= 3; [1, -1, 2]: sums >= 2 are (1,-1,2)=2,
    # (-1,-1,2)... enumerated here
    assert sign_flip_p([1, 1, 1], alternative="greater") == pytest.approx(1 / 8)
    values = [1, -1, 2]
    sums = [sum(v if (m >> i) & 1 else -v for i, v in enumerate(values)) for m in range(8)]
    expected = sum(s >= 2 for s in sums) / 8
    assert sign_flip_p(values, alternative="greater") == pytest.approx(expected)


def test_detectable_effect_uses_the_planning_sd_when_given():
    from memloop.core.stats import detectable_effect

    result = gate([0.1, 0.0, -0.1, 0.2, 0.0, 0.1, 0.0, 0.0, 0.1, -0.1], sd=0.25)
    assert result.sd_source == "planning"
    assert result.detectable == pytest.approx(detectable_effect(10, 0.25))
    observed = gate([0.1, 0.0, -0.1, 0.2, 0.0, 0.1, 0.0, 0.0, 0.1, -0.1])
    assert observed.sd_source == "observed"
    assert observed.sd == pytest.approx(
        float(np.std([0.1, 0, -0.1, 0.2, 0, 0.1, 0, 0, 0.1, -0.1], ddof=1))
    )


def test_gate_of_pairs_shared_users_and_stores_its_decision():
    cand = {"a": 0.6, "b": 0.5, "c": 0.7, "extra": 1.0}
    base = {"a": 0.5, "b": 0.5, "c": 0.4}
    result = gate_of(cand, base)
    assert result.paired.n == 3
    stored = result.to_dict()
    assert stored["verdict"] == "too few users"
    assert stored["n"] == 3 and stored["mean"] == pytest.approx((0.1 + 0.0 + 0.3) / 3)
    assert stored["level"] == 0.05 and stored["comparisons"] == 1


@pytest.mark.parametrize("users", [6, 10, 16])
def test_false_accepts_under_no_effect_are_at_most_half_the_level(users):
    # binary pairs: each user's difference is a mean of 8 (0/1 - 0/1) pairs, same distribution
    # for candidate and baseline; 2000 draws
    rng = np.random.default_rng(users)
    accepted = 0
    draws = 2000
    for _ in range(draws):
        base = rng.binomial(8, 0.5, size=users) / 8
        cand = rng.binomial(8, 0.5, size=users) / 8
        accepted += gate(list(cand - base)).verdict is Verdict.IMPROVED
    # the exact test's one-sided rate is at most 0.025; 3 binomial SEs of slack at 2000 draws
    assert accepted / draws <= 0.025 + 3 * np.sqrt(0.025 * 0.975 / draws)
