"""Statistics over users, the one home of memloop's intervals, tests and power planning.

The user is the independent unit. A comparison of two conditions is paired: for each user the
two conditions share, the difference condition - baseline (`paired_differences`), and then:

- `t_interval`: the Student t 95% interval of the mean, mean +- t(0.975, n-1) x sd / sqrt(n).
  None below two values, and None when every value is the same: a zero-width interval would
  claim a certainty that a handful of users cannot give (`no_interval` says why);
- `sign_flip_p`: the two-sided sign-flip permutation test of "the differences are symmetric
  around 0". Each difference's sign is flipped at random; p is the share of sign patterns whose
  |sum| is at least the observed one. Zero differences do not change under a flip, so only the
  non-zero ones are flipped: up to `EXACT_MAX` of them every one of the 2^k patterns is
  enumerated (exact p); above that, `MONTE_CARLO_DRAWS` seeded random patterns, p =
  (1 + hits) / (1 + draws) (a valid p-value; its Monte-Carlo SE is below 0.001 near 0.05);
- `Paired`: n, the mean difference, its t interval, the sign-flip p and how many users went up,
  tied (a difference of 0) or down. `Paired.to_dict()` is the stored shape.

Why not the bootstrap this module used before: most users' difference is exactly 0 when a prompt
changes little, and a studentized bootstrap then drops its zero-spread resamples. Measured under
no true effect (tests/core/test_core_stats.py), "the interval excludes 0" happened 8.6% of the time
at 16 users with 20% of them changed and 17.6% at 32 users with 10% changed, against the nominal
5%; the t interval stays below 5% there, and so does the sign-flip test.

The gate (`gate`, `GateResult`, `Verdict`) is the one decision rule of the optimizer loop: the
replay screen, the choice of a cycle on validation users and the registry's `best` alias all ask
it. From per-user differences it says `improved`, `degraded`, `inconclusive` or `too few users`
(and, with a non-inferiority margin, `not worse`), deciding on the exact sign-flip test at
ALPHA / (the number of candidates the one tested was chosen among). benchmarks/
gate_calibration.py measures its false accepts and power at the sizes memloop ships.

Power planning for a paired t test at two-sided alpha 0.05 (`users_needed`,
`detectable_effect`): exact, from the noncentral t distribution, given the SD across users of
the per-user difference.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Literal

SMALL_N = 10  # below this many users, say that the interval is wide
LEVEL = 0.95  # the interval's coverage
TIE = 1e-9  # differences within this of 0 (or of each other) count as equal
EXACT_MAX = 20  # up to this many non-zero differences the sign-flip test enumerates all 2^k
MONTE_CARLO_DRAWS = 100_000  # random sign patterns above EXACT_MAX (seeded)
POWER = 0.8
ALPHA = 0.05


def no_interval(values: list[float]) -> str | None:
    """Why `values` have no t interval, or None when they have one."""
    if not values:
        return "no users"
    if len(values) < 2:
        return "1 user"
    if max(values) - min(values) <= TIE:
        return f"all {len(values)} equal"
    return None


def t_interval(values: list[float], level: float = LEVEL) -> tuple[float, float] | None:
    """Student t interval of the mean of `values`: mean +- t(1 - (1-level)/2, n-1) x sd / sqrt(n).

    None when `no_interval` gives a reason (fewer than two values, or all of them equal), never a
    zero-width interval.
    """
    if no_interval(values) is not None:
        return None
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(1 - (1 - level) / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def sign_flip_p(
    diffs: list[float],
    *,
    draws: int = MONTE_CARLO_DRAWS,
    seed: int = 0,
    alternative: Literal["two-sided", "greater"] = "two-sided",
) -> float:
    """Sign-flip permutation p-value of the mean of `diffs` (H0: symmetric around 0).

    Two-sided: p = share of the sign patterns of the non-zero differences whose |sum| >= the
    observed |sum| (the observed pattern counts); `alternative="greater"`: the share whose sum >=
    the observed sum. Exact enumeration of all 2^k patterns for k <= EXACT_MAX non-zero
    differences; else `draws` random patterns from `seed`, p = (1 + hits) / (1 + draws). No
    non-zero difference gives p = 1. E.g. [1, 1, 1]: 2 of the 8 patterns reach |sum| = 3, p =
    0.25 (one-sided: 1 of 8, 0.125).
    """
    import numpy as np

    d = np.asarray([x for x in diffs if abs(x) > TIE], dtype=float)
    if d.size == 0:
        return 1.0
    two_sided = alternative == "two-sided"
    observed = abs(float(d.sum())) if two_sided else float(d.sum())
    slack = TIE * max(1.0, float(np.abs(d).sum()))  # float sums of a tie may differ in the last bit

    def reach(sums: Any) -> Any:
        return (np.abs(sums) if two_sided else sums) >= observed - slack

    if d.size <= EXACT_MAX:
        sums = np.zeros(1)
        for x in d:  # every pattern's sum, doubling per difference: 2^k values
            sums = np.concatenate([sums + x, sums - x])
        return float(np.mean(reach(sums)))
    rng = np.random.default_rng(seed)
    hits, left = 0, draws
    chunk = max(1, 2_000_000 // d.size)
    while left:
        k = min(chunk, left)
        signs = rng.integers(0, 2, size=(k, d.size)) * 2 - 1
        hits += int(np.sum(reach(signs @ d)))
        left -= k
    return (1 + hits) / (1 + draws)


@dataclass(frozen=True)
class Paired:
    """A paired difference over the users two results share.

    `mean`: the mean per-user difference (None without users); `t95`: its t interval, or None,
    with the reason in `no_interval`; `sign_flip_p`: the sign-flip test's two-sided p; `up`,
    `tied`, `down`: users whose difference is > 0, 0, < 0.
    """

    n: int
    mean: float | None
    t95: tuple[float, float] | None
    sign_flip_p: float | None
    up: int
    tied: int
    down: int
    no_interval: str | None = None

    @classmethod
    def of(cls, condition: dict[str, float], baseline: dict[str, float]) -> Paired:
        """`condition` - `baseline` per shared user ({user: value} each)."""
        return cls.of_differences(list(paired_differences(condition, baseline).values()))

    @classmethod
    def of_differences(cls, diffs: list[float]) -> Paired:
        """From per-user differences directly."""
        return cls(
            n=len(diffs),
            mean=sum(diffs) / len(diffs) if diffs else None,
            t95=t_interval(diffs),
            sign_flip_p=sign_flip_p(diffs) if diffs else None,
            up=sum(d > TIE for d in diffs),
            tied=sum(abs(d) <= TIE for d in diffs),
            down=sum(d < -TIE for d in diffs),
            no_interval=no_interval(diffs),
        )

    @property
    def diff(self) -> float | None:
        """The mean difference (the name callers used before `mean`)."""
        return self.mean

    @property
    def ci(self) -> tuple[float, float] | None:
        """The t interval (the name callers used before `t95`)."""
        return self.t95

    def to_dict(self) -> dict[str, Any]:
        """{"n", "mean", "t95": [lo, hi] or None, "sign_flip_p", "up", "tied", "down"}."""
        return {
            "n": self.n,
            "mean": self.mean,
            "t95": None if self.t95 is None else [self.t95[0], self.t95[1]],
            "sign_flip_p": self.sign_flip_p,
            "up": self.up,
            "tied": self.tied,
            "down": self.down,
        }

    def interval_text(self) -> str:
        """`[-0.02,+0.24]`, or `no interval (all 3 equal)`."""
        if self.t95 is None:
            return f"no interval ({self.no_interval})"
        return f"[{self.t95[0]:+.2f},{self.t95[1]:+.2f}]"

    def counts_text(self) -> str:
        """`3/1/1`: users up / tied / down."""
        return f"{self.up}/{self.tied}/{self.down}"

    def cells(self) -> list[str]:
        """A table's cells (core.tables.PAIRED_COLUMNS): n, mean diff, interval, p, up/tied/down.

        The interval is the t interval, or why there is none. A memory score is undefined where
        the upper bound does not beat random: n counts the users where both sides define it.
        """
        if self.mean is None:
            return ["0", "n/a", "-", "-", "-"]
        return [
            str(self.n),
            f"{self.mean:+.3f}",
            self.interval_text(),
            format_p(self.sign_flip_p),
            self.counts_text(),
        ]

    def __str__(self) -> str:
        """`+0.110 [+0.02,+0.20] p=0.062 n=5 up/tied/down 3/1/1`."""
        if self.mean is None:
            return "n/a (no shared users)"
        return (
            f"{self.mean:+.3f} {self.interval_text()} p={format_p(self.sign_flip_p)} "
            f"n={self.n} up/tied/down {self.counts_text()}"
        )


def format_p(p: float | None) -> str:
    """A p-value in three decimals, `<0.001` below that; `n/a` for None."""
    if p is None:
        return "n/a"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


def rate_interval(hits: int, runs: int, level: float = LEVEL) -> dict[str, Any]:
    """A binomial rate `hits / runs` with its Wilson interval at `level` (two-sided).

    The rate of a decision or an alarm measured over independent runs (users): the gate's
    false-accept rate (benchmarks/gate_calibration.py), an alarm's false-alarm and detection
    rates (benchmarks/health_alarms.py). Wilson's interval stays inside [0, 1] and is not empty
    at 0 or `runs` hits.
    """
    from scipy import stats

    if runs <= 0:
        raise ValueError(f"a rate needs runs > 0, not {runs}")
    p = hits / runs
    z = float(stats.norm.ppf(0.5 + level / 2))
    centre = (p + z * z / (2 * runs)) / (1 + z * z / runs)
    half = z * math.sqrt(p * (1 - p) / runs + z * z / (4 * runs * runs)) / (1 + z * z / runs)
    return {"rate": p, "ci95": [max(0.0, centre - half), min(1.0, centre + half)]}


def paired_differences(condition: dict[str, float], baseline: dict[str, float]) -> dict[str, float]:
    """Per user present in both: condition - baseline."""
    return {u: condition[u] - baseline[u] for u in sorted(set(condition) & set(baseline))}


def t_test_power(users: int, effect: float, sd: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t test at `alpha` with `users` users.

    The per-user differences have mean `effect` and SD `sd`: the t statistic is noncentral t with
    n - 1 degrees of freedom and noncentrality effect / sd x sqrt(n).
    """
    from scipy import stats

    df = users - 1
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    nc = abs(effect) / sd * math.sqrt(users)
    # the far tail as sf at -nc: scipy's nct.cdf gives NaN there for some (df, nc), e.g. (1, 8)
    return float(stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc))


def _check_planning(sd: float, power: float, alpha: float) -> None:
    if not (sd > 0 and math.isfinite(sd)):
        raise ValueError(f"the SD must be a positive number (got {sd})")
    if not 0 < alpha < 1 or not alpha < power < 1:
        raise ValueError(f"need 0 < alpha < power < 1 (got alpha {alpha}, power {power})")


def users_needed(effect: float, sd: float, *, power: float = POWER, alpha: float = ALPHA) -> int:
    """The fewest users (>= 2) whose paired t test reaches `power` for a true mean `effect`.

    `sd`: the SD across users of the per-user difference. Counts up from the normal
    approximation ((z(1 - alpha/2) + z(power)) x sd / effect)^2, which the t test needs a user or
    two more than.
    """
    from scipy import stats

    _check_planning(sd, power, alpha)
    if not (effect != 0 and math.isfinite(effect)):
        raise ValueError(f"the effect must be a non-zero number (got {effect})")
    effect = abs(effect)
    z = float(stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power))
    approx = (z * sd / effect) ** 2
    if approx > 1e9:
        raise ValueError(f"an effect of {effect} with SD {sd} needs over 10^9 users")
    n = max(2, math.floor(approx) - 1)
    while n > 2 and t_test_power(n - 1, effect, sd, alpha) >= power:
        n -= 1
    while t_test_power(n, effect, sd, alpha) < power:
        n += 1
    return n


def detectable_effect(
    users: int, sd: float, *, power: float = POWER, alpha: float = ALPHA
) -> float:
    """The smallest true mean difference `users` users detect with `power` (paired t test).

    `sd`: the SD across users of the per-user difference. Solves power(effect) = `power` for the
    noncentrality, then effect = noncentrality x sd / sqrt(users).
    """
    from scipy import optimize

    _check_planning(sd, power, alpha)
    if users < 2:
        raise ValueError(f"a t test needs at least 2 users (got {users})")

    def short(nc: float) -> float:  # power at noncentrality nc, minus the target
        return t_test_power(users, nc * sd / math.sqrt(users), sd, alpha) - power

    high = 1.0
    while short(high) < 0:
        high *= 2
    nc = optimize.brentq(short, 0.0, high, xtol=1e-10)
    return float(nc) * sd / math.sqrt(users)


@functools.lru_cache(maxsize=4096)
def _unit_detectable(users: int, alpha: float) -> float:
    """`detectable_effect` at SD 1: the effect scales with the SD, so the gate solves it once."""
    return detectable_effect(users, 1.0, alpha=alpha)


# ---------------------------------------------------------------- the gate


class Verdict(StrEnum):
    """What the gate concludes from per-user paired differences (candidate - baseline)."""

    IMPROVED = "improved"
    NOT_WORSE = "not worse"  # only with a non-inferiority margin
    DEGRADED = "degraded"
    INCONCLUSIVE = "inconclusive"
    TOO_FEW = "too few users"


def min_users(level: float) -> int:
    """The fewest users whose exact two-sided sign-flip p can reach `level`.

    With n users all moving one way, the smallest two-sided p is 2 / 2^n, so n must satisfy
    2^(1-n) <= level: 6 users at 0.05, 7 at 0.05 / 3 (three candidates compared).
    """
    if not 0 < level < 1:
        raise ValueError(f"the level must be in (0, 1) (got {level})")
    return max(2, math.ceil(1 - math.log2(level) - 1e-12))


@dataclass(frozen=True)
class GateResult:
    """One decision of the gate, with everything a reviewer needs to redo it.

    `level`: the per-comparison significance level, ALPHA / `comparisons` (Bonferroni: a choice
    among several candidates is tested at a level that keeps the whole choice at ALPHA);
    `p`: the two-sided exact sign-flip p of the differences; `p_not_worse`: the one-sided p of
    "the differences + margin are centred at or below 0" (None without a margin); `detectable`:
    the smallest true mean difference these many users detect at POWER (paired t test at
    `level`, with `sd`: the planning SD when given, else the observed one; None without either).
    """

    verdict: Verdict
    paired: Paired
    level: float
    comparisons: int
    min_users: int
    margin: float | None = None
    p_not_worse: float | None = None
    sd: float | None = None
    sd_source: str | None = None  # "planning" or "observed"
    detectable: float | None = None
    # a two-look decision (`TwoLooks`): the look that decided, its users, the sequential p
    look: int | None = None
    looks: int | None = None
    p_sequential: float | None = None

    @property
    def improved(self) -> bool:
        return self.verdict is Verdict.IMPROVED

    def to_dict(self) -> dict[str, Any]:
        """The stored shape: the verdict, the paired numbers, the level and what it could detect.

        A two-look decision adds `look`, `looks` and `p_sequential` (its `level` is then the whole
        rule's; `sign_flip_p` stays the plain test of the users it had).
        """
        sequential = {}
        if self.looks is not None:
            sequential = {"look": self.look, "looks": self.looks, "p_sequential": self.p_sequential}
        return {
            "verdict": self.verdict.value,
            **self.paired.to_dict(),
            **sequential,
            "method": (
                "exact sign-flip test, two-sided"
                if self.looks is None
                else f"exact sign-flip test, two-sided, {self.looks} looks with alpha spending"
            )
            + (", Bonferroni over " + str(self.comparisons) if self.comparisons > 1 else ""),
            "level": self.level,
            "comparisons": self.comparisons,
            "min_users": self.min_users,
            "margin": self.margin,
            "p_not_worse": self.p_not_worse,
            "sd": self.sd,
            "sd_source": self.sd_source,
            "detectable": self.detectable,
        }

    def __str__(self) -> str:
        """The decision in one line, as stored decisions print (`decision_text`)."""
        return decision_text(self.to_dict())


def gate(
    diffs: list[float],
    *,
    comparisons: int = 1,
    margin: float | None = None,
    alpha: float = ALPHA,
    sd: float | None = None,
) -> GateResult:
    """The one decision rule of memloop: is a candidate better than its baseline?

    `diffs`: one paired difference per user (candidate - baseline, same users, same draws).
    `comparisons`: how many candidates this one was chosen among (the level is alpha /
    comparisons). `margin`: with a margin, a candidate that is not shown better can still be
    shown `not worse` (its mean is above -margin: the one-sided sign-flip test of diffs +
    margin at level / 2). `sd`: a planning SD for the detectable effect.

    - `too few users`: fewer than `min_users(level)`: no outcome could reach the level;
    - `improved` / `degraded`: the two-sided exact sign-flip p <= level, mean above / below 0;
    - `not worse` (with a margin): not degraded, and the non-inferiority test passes;
    - `inconclusive`: otherwise.
    The sign-flip test is exact for any n and any share of ties (a t interval is reported beside
    it, not decided on): under no effect the gate says `improved` at most level / 2 of the time.
    """
    if comparisons < 1:
        raise ValueError(f"comparisons must be at least 1 (got {comparisons})")
    if margin is not None and not (margin > 0 and math.isfinite(margin)):
        raise ValueError(f"the non-inferiority margin must be a positive number (got {margin})")
    level = alpha / comparisons
    need = min_users(level)
    paired = Paired.of_differences(list(diffs))
    n = paired.n
    observed_sd = statistics.stdev(diffs) if n >= 2 else None
    source: str | None = "planning" if sd is not None else "observed"
    use_sd = sd if sd is not None else observed_sd
    if use_sd is None or use_sd <= TIE:  # no spread to plan on: no detectable effect
        use_sd = source = None
    detectable = _unit_detectable(n, level) * use_sd if use_sd is not None and n >= 2 else None
    p_not_worse = None
    if margin is not None and n:
        p_not_worse = sign_flip_p([d + margin for d in diffs], alternative="greater")
    if n < need:
        verdict = Verdict.TOO_FEW
    elif paired.sign_flip_p is not None and paired.sign_flip_p <= level + TIE:
        verdict = Verdict.IMPROVED if (paired.mean or 0) > 0 else Verdict.DEGRADED
    elif p_not_worse is not None and p_not_worse <= level / 2 + TIE:
        verdict = Verdict.NOT_WORSE
    else:
        verdict = Verdict.INCONCLUSIVE
    return GateResult(
        verdict=verdict,
        paired=paired,
        level=level,
        comparisons=comparisons,
        min_users=need,
        margin=margin,
        p_not_worse=p_not_worse,
        sd=use_sd,
        sd_source=source,
        detectable=detectable,
    )


def gate_of(candidate: dict[str, float], baseline: dict[str, float], **options: Any) -> GateResult:
    """`gate` of candidate - baseline over the users both have ({user: value} each)."""
    return gate(list(paired_differences(candidate, baseline).values()), **options)


def decision_text(decision: dict[str, Any]) -> str:
    """A stored gate decision (`GateResult.to_dict()`) in one line.

    `inconclusive, +0.050 [-0.10,+0.20] p=0.375 n=8 up/tied/down 2/5/1 (level 0.05);
    detectable effect 0.31`.
    """
    mean = "n/a" if decision["mean"] is None else f"{decision['mean']:+.3f}"
    t95 = decision.get("t95")
    interval = "no interval" if t95 is None else f"[{t95[0]:+.2f},{t95[1]:+.2f}]"
    text = (
        f"{decision['verdict']}, {mean} {interval} p={format_p(decision['sign_flip_p'])} "
        f"n={decision['n']} up/tied/down {decision['up']}/{decision['tied']}/{decision['down']} "
        f"(level {decision['level']:.3g}"
    )
    if decision["verdict"] == Verdict.TOO_FEW.value:
        text += f": needs {decision['min_users']} users"
    if decision.get("looks") is not None:
        text += (
            f"; look {decision['look']} of {decision['looks']}, sequential "
            f"p={format_p(decision['p_sequential'])}"
        )
    text += ")"
    if decision.get("detectable") is not None:
        text += f"; detectable effect {decision['detectable']:.2f}"
    return text


# ---------------------------------------------------------------- two looks


def first_look_level(alpha: float = ALPHA, fraction: float = 0.5) -> float:
    """The level spent at a look after `fraction` of the users (Lan-DeMets, O'Brien-Fleming type).

    alpha_1 = 2 - 2 Phi(z(1 - alpha/2) / sqrt(fraction)): 0.0056 of 0.05 at half the users, so
    only a large effect stops early and the last look keeps nearly all of alpha.
    """
    from scipy import stats

    if not 0 < fraction < 1:
        raise ValueError(f"the first look's fraction must be in (0, 1) (got {fraction})")
    z = float(stats.norm.ppf(1 - alpha / 2))
    return float(2 - 2 * stats.norm.cdf(z / math.sqrt(fraction)))


def _sums(d: Any, draws: int | None, rng: Any) -> Any:
    """Every sign pattern's sum of `d` (all 2^k), or `draws` random ones."""
    import numpy as np

    if draws is None:
        sums = np.zeros(1)
        for x in d:
            sums = np.concatenate([sums + x, sums - x])
        return sums
    signs = rng.integers(0, 2, size=(draws, d.size)) * 2 - 1
    return signs @ d if d.size else np.zeros(draws)


@dataclass(frozen=True)
class TwoLooks:
    """An exact group-sequential sign-flip rule: a look at the first `first` users, then at all.

    Look 1 decides at `first_look_level(alpha)` on the first users' differences (the plain exact
    sign-flip test: its level holds whatever the rest will show). Look 2 decides on the
    sequential p: under "every difference is symmetric around 0", the probability that look 1
    had decided, plus the probability that it had not and the whole sum is at least as far from
    0 as observed. Its exact null distribution is that of the two halves' independent sign flips
    (enumerated up to EXACT_MAX non-zero differences a half, else seeded Monte-Carlo draws), so
    the rule's false-accept rate is at most alpha given the users' magnitudes: in all at most
    alpha / 2 `improved` under no effect. A large effect stops at look 1, with half the users.
    """

    users: int  # the users the design plans for in all
    alpha: float = ALPHA

    @property
    def first(self) -> int:
        """The users of look 1: half, rounded down."""
        return self.users // 2

    @property
    def first_level(self) -> float:
        return first_look_level(self.alpha, self.first / self.users)

    @property
    def can_stop_early(self) -> bool:
        """Look 1 can decide: its users all moving one way reach its level."""
        return self.first >= 1 and self.first >= min_users(self.first_level)

    def look_one(self, diffs: list[float]) -> GateResult | None:
        """The decision at look 1 on the first users' differences; None: go on to look 2."""
        if len(diffs) != self.first:
            raise ValueError(f"look 1 takes the first {self.first} users (got {len(diffs)})")
        if not self.can_stop_early:
            return None
        result = gate(diffs, alpha=self.first_level)
        if result.verdict not in (Verdict.IMPROVED, Verdict.DEGRADED):
            return None
        return replace(result, look=1, looks=2, p_sequential=result.paired.sign_flip_p)

    def look_two(
        self, first: list[float], rest: list[float], *, draws: int = MONTE_CARLO_DRAWS
    ) -> GateResult:
        """The decision at look 2 on all users (look 1 having gone on)."""
        if len(first) != self.first or len(first) + len(rest) != self.users:
            raise ValueError(
                f"look 2 takes the first {self.first} and the other {self.users - self.first} "
                f"users (got {len(first)} and {len(rest)})"
            )
        p = self.sequential_p(first, rest, draws=draws)
        diffs = list(first) + list(rest)
        result = gate(diffs, alpha=self.alpha)
        verdict = result.verdict
        if verdict is not Verdict.TOO_FEW:
            mean = result.paired.mean or 0.0
            if p <= self.alpha + TIE and mean != 0:
                verdict = Verdict.IMPROVED if mean > 0 else Verdict.DEGRADED
            else:
                verdict = Verdict.INCONCLUSIVE
        return replace(result, verdict=verdict, look=2, looks=2, p_sequential=p)

    def sequential_p(
        self,
        first: list[float],
        rest: list[float],
        *,
        draws: int = MONTE_CARLO_DRAWS,
        seed: int = 0,
    ) -> float:
        """P(look 1 decides, or it does not and |sum| >= observed |sum|) under sign flips."""
        import numpy as np

        d1 = np.asarray([x for x in first if abs(x) > TIE], dtype=float)
        d2 = np.asarray([x for x in rest if abs(x) > TIE], dtype=float)
        observed = abs(float(d1.sum() + d2.sum()))
        slack = TIE * max(1.0, float(np.abs(d1).sum() + np.abs(d2).sum()))
        exact = d1.size <= EXACT_MAX and d2.size <= EXACT_MAX
        rng = np.random.default_rng(seed)
        s1 = _sums(d1, None if exact else draws, rng)
        s2 = _sums(d2, None if exact else draws, rng)
        if self.can_stop_early and d1.size:
            # look 1 decides when its own sign-flip p is at most its level: |S1| >= c1
            ordered = np.sort(np.abs(s1))
            tail = (ordered.size - np.searchsorted(ordered, ordered - slack, side="left")) / (
                ordered.size
            )  # P(|S1| >= each value)
            reach = ordered[tail <= self.first_level + TIE]
            c1 = float(reach.min()) if reach.size else math.inf
            stops = np.abs(s1) >= c1 - slack
        else:
            stops = np.zeros(s1.shape, dtype=bool)
        if exact:
            s2 = np.sort(s2)
            low = np.searchsorted(s2, -observed + slack - s1, side="right")  # s1 + s2 <= -obs
            high = s2.size - np.searchsorted(s2, observed - slack - s1, side="left")
            far = (low + high) / s2.size
            return float(np.mean(np.where(stops, 1.0, np.minimum(far, 1.0))))
        hits = int(np.sum(stops | (np.abs(s1 + s2) >= observed - slack)))
        return (1 + hits) / (1 + draws)
