"""The two-look rule (core/stats.TwoLooks): its level, checked against every sign pattern."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memloop.core import stats
from memloop.core.stats import TwoLooks, Verdict, first_look_level, sign_flip_p


def normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def test_the_first_look_spends_the_obrien_fleming_share_of_alpha():
    z = 1.959963984540054  # z(0.975)
    assert first_look_level(0.05, 0.5) == pytest.approx(2 - 2 * normal_cdf(z / math.sqrt(0.5)))
    assert first_look_level(0.05, 0.5) == pytest.approx(0.00557, abs=1e-5)
    rule = TwoLooks(26)
    assert (rule.first, rule.can_stop_early) == (13, True)
    assert TwoLooks(16).can_stop_early is False  # 8 users cannot reach 0.0056: 2/2^8 = 0.0078


def brute_force(magnitudes: list[float], first: int, alpha: float = 0.05):
    """Every sign pattern of `magnitudes`: look 1's decision, the sequential p, the rejections."""
    m = np.asarray(magnitudes, dtype=float)
    n = m.size
    codes = np.arange(2**n, dtype=np.int64)
    signs = ((codes[:, None] >> np.arange(n)) & 1) * 2 - 1
    s1 = np.abs(signs[:, :first] @ m[:first])
    total = np.abs(signs @ m)
    eps = 1e-9
    p1 = np.array([np.mean(s1 >= v - eps) for v in np.unique(s1)])
    p1_of = dict(zip(np.unique(s1), p1, strict=True))
    level1 = first_look_level(alpha, first / n)
    stops = np.array([p1_of[v] <= level1 + eps for v in s1])
    going = np.sort(total[~stops])
    beyond = (going.size - np.searchsorted(going, total - eps, side="left")) / total.size
    p_seq = np.where(stops, np.nan, stops.mean() + beyond)
    reject = stops | (p_seq <= alpha + eps)
    return signs, stops, p_seq, reject


@pytest.mark.parametrize(
    "magnitudes",
    [
        [0.01 * (i + 1) + 0.003 * (i % 3) for i in range(18)],  # distinct
        [0.05] * 18,  # all tied: the coarsest null distribution
        [0.02, 0.04, 0.0, 0.04, 0.02, 0.06, 0.02, 0.0, 0.04] * 2,  # ties and zeros
    ],
)
def test_the_rule_accepts_at_most_alpha_of_all_sign_patterns_and_matches_them(magnitudes):
    """Under no effect every sign pattern is equally likely: the share of patterns the rule
    rejects on is its exact level. The library's decisions agree with the enumeration."""
    rule = TwoLooks(len(magnitudes))
    signs, stops, p_seq, reject = brute_force(magnitudes, rule.first)
    assert reject.mean() <= 0.05 + 1e-12
    assert reject.mean() > 0.02  # the rule is not trivially conservative
    rng = np.random.default_rng(5)
    picks = list(rng.choice(len(signs), 40, replace=False)) + list(np.flatnonzero(stops)[:5])
    for i in picks:
        d = list(signs[i] * np.asarray(magnitudes))
        first, rest = d[: rule.first], d[rule.first :]
        early = rule.look_one(first)
        assert (early is not None) == bool(stops[i])
        if early is None:
            assert rule.sequential_p(first, rest) == pytest.approx(p_seq[i], abs=1e-12)
            decided = rule.look_two(first, rest).verdict in (Verdict.IMPROVED, Verdict.DEGRADED)
            assert decided == bool(reject[i])


def test_a_large_effect_stops_at_half_the_users_and_a_small_one_goes_on():
    rng = np.random.default_rng(1)
    rule = TwoLooks(26)
    large = list(0.10 + 0.045 * rng.standard_normal(13))
    early = rule.look_one(large)
    assert early is not None and early.verdict is Verdict.IMPROVED
    assert (early.look, early.looks, early.paired.n) == (1, 2, 13)
    assert early.level == pytest.approx(first_look_level(0.05, 0.5))
    small = list(0.03 + 0.045 * rng.standard_normal(26))
    assert rule.look_one(small[:13]) is None
    final = rule.look_two(small[:13], small[13:])
    assert (final.look, final.paired.n, final.level) == (2, 26, 0.05)
    assert "look 2 of 2, sequential p=" in str(final)


def test_without_a_possible_first_look_the_rule_is_the_plain_test():
    d = [0.02, -0.01, 0.03, 0.05, 0.0, 0.04, 0.01, -0.02, 0.06, 0.03]
    rule = TwoLooks(10)
    assert rule.can_stop_early is False and rule.look_one(d[:5]) is None
    assert rule.sequential_p(d[:5], d[5:]) == pytest.approx(sign_flip_p(d), abs=1e-12)


def test_monte_carlo_draws_agree_with_the_enumeration(monkeypatch):
    magnitudes = [0.01 * (i + 1) for i in range(18)]
    d = [m if i % 4 else -m for i, m in enumerate(magnitudes)]
    rule = TwoLooks(18)
    exact = rule.sequential_p(d[:9], d[9:])
    monkeypatch.setattr(stats, "EXACT_MAX", 4)  # both halves now drawn at random
    drawn = rule.sequential_p(d[:9], d[9:], draws=200_000)
    assert drawn == pytest.approx(exact, abs=0.005)
