"""The quickstart's detectable-effect line, computed from the runs' per-user numbers."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

from memloop.core.stats import detectable_effect
from memloop.experiments.commands.quickstart_cmd import detectable_line


def _rows(mine: dict[str, float], base: dict[str, float], objective: str = "state_accuracy"):
    """A baseline and an evolved run ranked on `objective`, their per-user values under it
    (and the other measure's at 0, which the line must not read)."""
    other = "state_prob" if objective == "state_accuracy" else "state_accuracy"
    zeros = dict.fromkeys(base, 0.0)
    baseline = SimpleNamespace(
        baseline=None, objective=objective, per_user={objective: base, other: zeros}
    )
    evolved = SimpleNamespace(
        baseline=baseline, objective=objective, per_user={objective: mine, other: zeros}
    )
    return [baseline, evolved]


def test_the_detectable_effect_comes_from_the_paired_differences():
    line = detectable_line(_rows({"a": 0.5, "b": 0.75, "c": 1.0}, {"a": 0.5, "b": 0.5, "c": 0.5}))
    effect = detectable_effect(3, 0.25)  # the differences 0, 0.25, 0.5 have SD 0.25
    assert "3 test users and a per-user SD of 0.250 (paired differences)" in line
    assert f"a state accuracy difference below {effect:.2f} is not detectable" in line


def test_runs_ranked_on_state_prob_plan_on_state_prob():
    line = detectable_line(
        _rows({"a": 0.3, "b": 0.35, "c": 0.4}, {"a": 0.3, "b": 0.3, "c": 0.3}, "state_prob")
    )
    effect = detectable_effect(3, 0.05)  # the differences 0, 0.05, 0.1 have SD 0.05
    assert "per-user SD of 0.050 (paired differences)" in line
    assert f"a state prob difference below {effect:.2f} is not detectable" in line


def test_without_differences_the_baselines_spread_is_used_and_named():
    base = {"a": 0.25, "b": 0.5, "c": 1.0, "d": 0.5}
    line = detectable_line(_rows(dict(base), base))
    sd = 2**0.5 * statistics.stdev(base.values())
    assert f"per-user SD of {sd:.3f} (no difference varied: sqrt(2) x the baseline's SD" in line
    assert f"below {detectable_effect(4, sd):.2f}" in line
    assert "too few" in detectable_line(_rows({"a": 1.0}, {"a": 0.5}))
