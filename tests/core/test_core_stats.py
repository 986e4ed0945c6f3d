"""Paired statistics over users: the t interval, the sign-flip test, the up/tied/down counts and
power planning, on hand-computed values, plus the type-I error of the paired tests when most
users' difference is exactly 0."""

from __future__ import annotations

import math

import numpy as np
import pytest

from memloop.core import stats
from memloop.core.stats import (
    Paired,
    detectable_effect,
    paired_differences,
    sign_flip_p,
    t_interval,
    t_test_power,
    users_needed,
)

T_975_9 = 2.2621571627409915  # t(0.975, 9 df), from tables
T_975_1 = 12.706204736174707  # t(0.975, 1 df)


def test_t_interval_is_mean_plus_minus_t_times_the_standard_error():
    values = [0.1, 0.4, -0.2, 0.3, 0.0, 0.5, 0.2, -0.1, 0.35, 0.15]
    mean = sum(values) / 10  # 0.17
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 9)
    half = T_975_9 * sd / math.sqrt(10)
    lo, hi = t_interval(values)
    assert (lo, hi) == pytest.approx((mean - half, mean + half), abs=1e-9)
    assert mean == pytest.approx(0.17)
    # two users: an honest, very wide interval (12.7 standard errors each side)
    lo, hi = t_interval([-0.2, 0.0])
    assert (lo, hi) == pytest.approx((-0.1 - T_975_1 * 0.1, -0.1 + T_975_1 * 0.1))


def test_no_interval_is_ever_zero_width():
    assert t_interval([]) is None and t_interval([0.4]) is None
    assert t_interval([0.25, 0.25, 0.25]) is None  # was the point interval [0.25, 0.25]
    p = Paired.of({"a": 0.5, "b": 0.75, "c": 1.0}, {"a": 0.25, "b": 0.5, "c": 0.75})
    assert (p.n, p.mean, p.t95, p.no_interval) == (3, 0.25, None, "all 3 equal")
    assert p.to_dict()["t95"] is None
    assert "no interval (all 3 equal)" in str(p) and "[" not in str(p)
    assert Paired.of({"a": 1.0}, {"a": 0.0}).no_interval == "1 user"
    none = Paired.of({}, {"a": 0.0})
    assert (none.n, none.mean, none.t95, none.sign_flip_p) == (0, None, None, None)
    assert none.no_interval == "no users"


@pytest.mark.parametrize(
    "diffs, p",
    [
        ([1, 1, 1], 2 / 8),  # all + and all - reach |sum| 3
        ([0.25, 0.25, 0.25], 2 / 8),
        ([1, 1, 1, 0, 0, 0], 2 / 8),  # a zero does not change under a flip
        ([1, -1], 1.0),
        ([2, 1, -1], 6 / 8),  # sums +-4, +-2, +-2, 0, 0: six reach |2|
        ([3, 1, 1, 1], 2 / 16),
        ([0, 0], 1.0),
        ([0.5], 1.0),
    ],
)
def test_sign_flip_p_by_enumeration(diffs, p):
    assert sign_flip_p(diffs) == pytest.approx(p)


def test_sign_flip_monte_carlo_agrees_with_enumeration(monkeypatch):
    diffs = list(np.random.default_rng(3).normal(0.1, 1.0, 22))  # above EXACT_MAX non-zero ones
    sampled = sign_flip_p(diffs)
    assert sampled == sign_flip_p(diffs)  # seeded
    monkeypatch.setattr(stats, "EXACT_MAX", 22)
    exact = sign_flip_p(diffs)
    assert 0.05 < exact < 0.95 and sampled == pytest.approx(exact, abs=0.005)
    monkeypatch.setattr(stats, "EXACT_MAX", 20)
    # every sign the same among 30: the smallest Monte-Carlo p, 1 / (1 + draws)
    assert sign_flip_p([0.1] * 30) == pytest.approx(1 / (1 + stats.MONTE_CARLO_DRAWS))


def test_paired_counts_and_stored_shape():
    condition = {"a": 0.5, "b": 0.2, "c": 1.0, "d": 0.4, "e": 0.3, "x": 9.0}
    baseline = {"a": 0.25, "b": 0.5, "c": 1.0, "d": 0.3, "e": 0.3, "y": 9.0}
    p = Paired.of(condition, baseline)
    diffs = [0.25, -0.3, 0.0, 0.1, 0.0]  # a..e; x and y are not shared
    mean = sum(diffs) / 5  # 0.01
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 4)
    half = 2.7764451051977987 * sd / math.sqrt(5)  # t(0.975, 4 df)
    # sign flips of the non-zero 0.25, -0.3, 0.1 (sum 0.05): |sums| .65 .15 .45 .05 (x2) all >= .05
    assert p.sign_flip_p == pytest.approx(1.0)
    assert (p.up, p.tied, p.down) == (2, 2, 1)
    assert p.to_dict() == {
        "n": 5,
        "mean": pytest.approx(mean),
        "t95": [pytest.approx(mean - half), pytest.approx(mean + half)],
        "sign_flip_p": pytest.approx(1.0),
        "up": 2,
        "tied": 2,
        "down": 1,
    }
    assert (p.diff, p.ci) == (p.mean, p.t95)  # the names older callers read
    assert str(p) == (
        f"+0.010 [{mean - half:+.2f},{mean + half:+.2f}] p=1.000 n=5 up/tied/down 2/2/1"
    )


def sparse_differences(rng, n: int, changed: float, runs: int) -> np.ndarray:
    """`runs` x `n` per-user differences under no true effect: each user changed with
    probability `changed`, a changed user's difference +-0.25 or +-0.5 (random sign), the others
    exactly 0."""
    size = (runs, n)
    step = rng.choice([0.25, 0.5], size=size) * rng.choice([-1.0, 1.0], size=size)
    return np.where(rng.random(size) < changed, step, 0.0)


@pytest.mark.parametrize("n, changed", [(16, 0.2), (32, 0.1)])
def test_type_one_error_with_mostly_tied_users_is_at_most_nominal(n, changed):
    diffs = sparse_differences(np.random.default_rng(2026), n, changed, 1000)
    excludes = flips = 0
    for row in diffs.tolist():
        interval = t_interval(row)
        excludes += interval is not None and (interval[0] > 0 or interval[1] < 0)
        flips += sign_flip_p(row) <= 0.05
    # measured at seed 2026: t interval 1.5% / 0.8%, sign-flip 0.2% / 0.1% (the old
    # studentized bootstrap: 8.6% at n=16, 17.6% at n=32)
    print(f"n={n} changed={changed}: t {excludes / 1000:.3f} sign-flip {flips / 1000:.3f}")
    assert excludes / 1000 <= 0.06
    assert flips / 1000 <= 0.06


@pytest.mark.parametrize(
    "draw, truth",
    [
        (lambda rng: rng.normal(0.1, 0.3, 10), 0.1),
        # per-user differences of two accuracies over 12 questions each
        (lambda rng: (rng.binomial(12, 0.55, 10) - rng.binomial(12, 0.45, 10)) / 12, 0.1),
    ],
)
def test_t_interval_coverage_at_ten_users(draw, truth):
    rng = np.random.default_rng(1)
    runs = 400
    hits = 0
    for _ in range(runs):
        interval = t_interval(list(draw(rng)))
        assert interval is not None
        hits += interval[0] <= truth <= interval[1]
    assert hits / runs >= 0.92


def test_paired_differences_use_shared_users_only():
    assert paired_differences({"a": 0.5, "b": 0.2, "c": 1.0}, {"a": 0.25, "b": 0.5}) == {
        "a": 0.25,
        "b": -0.3,
    }


def power_by_hand(n: int, effect: float, sd: float) -> float:
    from scipy import stats as sps

    crit = sps.t.ppf(0.975, n - 1)
    nc = effect / sd * math.sqrt(n)
    return sps.nct.sf(crit, n - 1, nc) + sps.nct.cdf(-crit, n - 1, nc)


@pytest.mark.parametrize(
    "sd, effect", [(0.2, 0.1), (1.0, 0.2), (0.3, 0.05), (1.0, 0.8), (0.15, 0.1)]
)
def test_users_needed_is_the_first_n_with_80_percent_power(sd, effect):
    n = users_needed(effect, sd)
    assert power_by_hand(n, effect, sd) >= 0.8 > power_by_hand(n - 1, effect, sd)
    # the normal approximation, plus the t test's user or two (or three at a handful of users)
    normal = math.ceil(((1.959963984540054 + 0.8416212335729143) * sd / effect) ** 2)
    assert normal <= n <= normal + 3
    assert users_needed(-effect, sd) == n


def test_users_needed_known_value():
    # effect 0.1 on an SD of 0.2 (d = 0.5): 34 users, power 0.8078 (as G*Power reports)
    assert users_needed(0.1, 0.2) == 34
    assert t_test_power(34, 0.1, 0.2) == pytest.approx(0.8077775, abs=1e-6)
    assert t_test_power(33, 0.1, 0.2) < 0.8


@pytest.mark.parametrize("users", [2, 3, 16, 34, 200])
def test_detectable_effect_is_the_inverse(users):
    effect = detectable_effect(users, 0.2)
    assert power_by_hand(users, effect, 0.2) == pytest.approx(0.8, abs=1e-9)
    assert users_needed(effect * 1.000001, 0.2) == users
    normal = (1.959963984540054 + 0.8416212335729143) * 0.2 / math.sqrt(users)
    assert effect > normal  # the t test needs a larger effect than the normal approximation
    if users >= 16:
        assert effect == pytest.approx(normal, rel=0.08)


def test_planning_refuses_what_has_no_answer():
    with pytest.raises(ValueError, match="SD must be a positive"):
        users_needed(0.1, 0.0)
    with pytest.raises(ValueError, match="effect must be a non-zero"):
        users_needed(0.0, 0.2)
    with pytest.raises(ValueError, match="at least 2 users"):
        detectable_effect(1, 0.2)
    with pytest.raises(ValueError, match="alpha < power"):
        detectable_effect(10, 0.2, power=0.01)


def test_power_command_prints_users_or_detectable_effect(capsys):
    from memloop.experiments.cli import main

    assert main(["power", "--sd", "0.2", "--effect", "0.1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("users needed: 34 to detect a mean difference of 0.1\n")
    assert "two-sided alpha 0.05, power 0.8" in out
    assert main(["power", "--sd", "0.2", "--users", "16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"minimum detectable effect: {detectable_effect(16, 0.2):.4g} with 16")
    assert "0.1499" in out


def test_power_plans_on_a_designs_measured_sd(tmp_path, capsys):
    import json

    from memloop.experiments.cli import main

    design = tmp_path / "design.json"
    design.write_text(
        json.dumps(
            {
                "scorings": {
                    "json 0/1": {"planning_sd": 0.26, "planning_sd_of": "the largest SD"},
                    "letters P": {"planning_sd": 0.12, "planning_sd_of": "the largest SD"},
                }
            }
        )
    )
    argv = ["power", "--planning", str(design), "--scoring", "letters P", "--users", "10"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"minimum detectable effect: {detectable_effect(10, 0.12):.4g} with 10")
    assert f"SD of the per-user differences 0.12: letters P, the largest SD, from {design}" in out
    assert main([*argv[:4], "P", "--users", "10"]) == 2
    assert "--scoring 'P': " + str(design) + " has 'json 0/1', 'letters P'" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--effect", "0.1"], "give either --sd or --planning"),
        (["--sd", "0.2"], "give either --effect"),
        (["--sd", "0.2", "--effect", "0.1", "--users", "8"], "give either --effect"),
        (["--sd", "0", "--effect", "0.1"], "SD must be a positive number"),
        (["--sd", "0.2", "--users", "1"], "at least 2 users"),
        (["--sd", "0.2", "--effect", "0"], "effect must be a non-zero number"),
    ],
)
def test_power_command_bad_input_is_one_line_and_exit_2(capsys, args, message):
    from memloop.experiments.cli import main

    assert main(["power", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("memloop: error: ") and message in err
