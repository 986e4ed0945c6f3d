"""The bootstrap interval of a mean: values on hand-made data, coverage by simulation."""

from __future__ import annotations

import numpy as np
import pytest

from memloop.core.stats import mean_ci, paired_differences


def test_small_and_degenerate_inputs():
    assert mean_ci([]) is None and mean_ci([0.4]) is None
    # two users: every resample with a spread has t = 0; a collapsed interval would mislead
    assert mean_ci([-0.2, 0.0]) is None
    assert mean_ci([0.25, 0.25, 0.25]) == (0.25, 0.25)


def test_interval_is_built_around_the_mean_and_deterministic():
    values = [0.1, 0.4, -0.2, 0.3, 0.0, 0.5, 0.2, -0.1, 0.35, 0.15]
    lo, hi = mean_ci(values)
    mean = sum(values) / len(values)
    assert lo < mean < hi
    assert mean_ci(values) == (lo, hi)  # same seed, same interval
    # about the t interval's width at n = 10: 2 x 2.26 x sd / sqrt(10)
    t_width = 2 * 2.262 * float(np.std(values, ddof=1)) / len(values) ** 0.5
    assert hi - lo == pytest.approx(t_width, rel=0.35)


@pytest.mark.parametrize(
    "draw, truth",
    [
        (lambda rng: rng.normal(0.1, 0.3, 10), 0.1),
        (lambda rng: rng.exponential(1.0, 10) - 1.0, 0.0),  # skewed
        # per-user differences of two accuracies over 12 questions each
        (lambda rng: (rng.binomial(12, 0.55, 10) - rng.binomial(12, 0.45, 10)) / 12, 0.1),
    ],
)
def test_coverage_at_ten_users_is_at_least_090(draw, truth):
    rng = np.random.default_rng(1)
    runs = 400
    hits = 0
    for i in range(runs):
        interval = mean_ci(list(draw(rng)), seed=i)
        assert interval is not None
        hits += interval[0] <= truth <= interval[1]
    assert hits / runs >= 0.90


def test_paired_differences_use_shared_users_only():
    assert paired_differences({"a": 0.5, "b": 0.2, "c": 1.0}, {"a": 0.25, "b": 0.5}) == {
        "a": 0.25,
        "b": -0.3,
    }
