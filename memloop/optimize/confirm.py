"""The one decision on fresh confirmation users: a pre-declared candidate against the seed.

A run with `environment.confirm_users` keeps those users out of everything the loop does: no
feedback, screen, validation or selection reads them (`RunContext.evaluate_splits` evaluates
train, val and test only). After the last cycle the run declares its candidate, once and in
writing (confirm/declared.json, before any confirmation episode exists):

- the evolvers that screen on training users and accept their own edits (`edits`, `reflective`:
  `confirms = "last"`): the last cycle;
- those whose candidates are built from validation scores (`playbook`, GEPA, and by default any
  plug-in): the cycle with the best validation objective (`confirms = "validation"`).

The gate (core/stats.py) then compares the candidate with the seed on the confirmation users,
both evaluated in whole episodes with the same draws: once at 0.05, or with `confirm_looks: 2`
(the default when look 1 can decide) on the exact two-look rule (`TwoLooks`), which stops at half
the users when the effect is large. Its decision is the run's verdict and names `best`
(runs/cycles.select_cycle). A candidate whose prompts are the seed's is reported as identical and
nothing is evaluated.

Layout under the run folder: confirm/declared.json, confirm/look_<n>/<seed|candidate>/ (each an
evaluation folder, resumed from its checkpoints), confirm/decision.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json, json_sha256
from memloop.core.stats import GateResult, TwoLooks, gate
from memloop.runs.cycles import (
    CONFIRM_ARTIFACT,
    CONFIRM_DECISION,
    CONFIRM_FOLDER,
    CONFIRM_SPLIT,
    SEED_CYCLE,
    SELECTION_SPLIT,
    Confirmation,
    CycleRecord,
    load_confirmation,
    per_user_values,
)

if TYPE_CHECKING:
    from memloop.environment.data import UserItem

RunContext = Any  # optimize/context.py's, which calls this module (no import back)

FOLDER = CONFIRM_FOLDER
ARTIFACT = CONFIRM_ARTIFACT
DECISION = CONFIRM_DECISION
DECLARED = "declared.json"

RULES = {
    "last": "the last cycle",
    "validation": "the best validation cycle",
}


def candidate_rule(ctx: RunContext) -> str:
    """`last` or `validation`: how this condition's candidate is declared.

    A search that evolves by itself (GEPA) builds candidates from validation scores; otherwise
    its evolver's class attribute `confirms` says (default `validation`).
    """
    if ctx.search.evolves_itself:
        return "validation"
    from memloop.optimize import registry

    cls = registry.optimizer_class(ctx.evolver_name, "evolver", "evolvers", ctx._base_dir())
    rule = getattr(cls, "confirms", "validation")
    if rule not in RULES:
        raise UserError(
            f"evolver {ctx.evolver_name}: confirms = {rule!r}; use one of {', '.join(RULES)}"
        )
    return str(rule)


def declare(records: list[CycleRecord], rule: str, objective: str) -> int:
    """The cycle `rule` names among the finished `records`."""
    if rule == "last" or not records:
        return records[-1].cycle if records else SEED_CYCLE
    scored = [(r, r.score(SELECTION_SPLIT, objective)) for r in records]
    defined = [(r, s) for r, s in scored if s is not None]
    if not defined:  # no validation value to choose on: the search's own last word
        return records[-1].cycle
    best, _ = max(defined, key=lambda rs: (rs[1], -rs[0].cycle))
    return best.cycle


def confirm(ctx: RunContext, records: list[CycleRecord]) -> Confirmation | None:
    """Declare the candidate, evaluate it and the seed on the confirmation users, decide.

    None when the run has no confirmation users. A rerun reads a finished decision back; an
    interrupted one resumes its evaluations from their checkpoints. A declaration on disk that
    names another candidate (the cycles changed under it) is refused in one line.
    """
    users: list[UserItem] = ctx.users.get(CONFIRM_SPLIT, [])
    if not users or not records:
        return None
    folder = ctx.run_dir / FOLDER
    done = load_confirmation(ctx.run_dir)
    if done is not None:
        return done
    rule = candidate_rule(ctx)
    objective = ctx.objective.value
    k = declare(records, rule, objective)
    prompts = ctx.store.saved_prompts(k) or ctx.initial_prompts
    seed = ctx.store.saved_prompts(SEED_CYCLE) or ctx.initial_prompts
    base = {
        "candidate": k,
        "rule": RULES[rule],
        "objective": objective,
        "users": [u.id for u in users],
        "looks": ctx.config.confirm_looks,
    }
    declared = {**base, "prompts_sha256": json_sha256(prompts)}
    path = folder / DECLARED
    if path.is_file():
        before = json.loads(path.read_text())
        if before != declared:
            raise UserError(
                f"{path}: the run declared cycle {before['candidate']} for confirmation, now it "
                f"would declare cycle {k}; the declaration is fixed before the confirmation runs "
                "(remove the run folder's confirm/ to declare again)"
            )
    else:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, declared)
    null = _null_control(ctx, users, seed, folder, objective) if ctx.config.null_control else None
    if json_sha256(prompts) == json_sha256(seed):
        result = Confirmation(**base, verdict=Confirmation.IDENTICAL, null=null)
        atomic_write_json(folder / DECISION, result.model_dump(mode="json"))
        return result
    decision, seed_scores, scores = _decide(ctx, users, seed, prompts, folder, objective)
    result = Confirmation(
        **base,
        verdict=decision.verdict.value,
        seed=seed_scores,
        scores=scores,
        gate=decision.to_dict(),
        null=null,
    )
    atomic_write_json(folder / DECISION, result.model_dump(mode="json"))
    return result


NULL_DRAW = 1_000_000  # the null control's draw when an endpoint samples (repeats use 1, 2, ...)
NULL_PREFIX = "Task: "  # a change of wording that adds no instruction


def null_prompts(seed: dict[str, str]) -> dict[str, str]:
    """The seed reworded without a new instruction: each text behind NULL_PREFIX."""
    return {name: NULL_PREFIX + text for name, text in seed.items()}


def _null_control(
    ctx: RunContext, users: list[UserItem], seed: dict[str, str], folder: Path, objective: str
) -> dict[str, Any]:
    """The seed scored again as if it were a candidate, by the same rule: the noise floor.

    When the agent or the simulated user samples (temperature > 0), the seed itself under a draw
    of its own; otherwise a second scoring of the same seed would repeat every answer, so the
    seed reworded (`null_prompts`): a change of prompt that says nothing new, which moves the
    writer's outputs and the conversations the way any candidate does.
    """
    if ctx.clients.sampled():
        what = f"the seed again, draw {NULL_DRAW}"
        prompts, clients = seed, ctx.clients.with_draw(NULL_DRAW)
    else:
        what = f"the seed reworded ({NULL_PREFIX.strip()!r} before each text)"
        prompts, clients = null_prompts(seed), None
    decision, seed_scores, scores = _decide(
        ctx, users, seed, prompts, folder, objective, name="null", clients=clients
    )
    return {
        "what": what,
        "verdict": decision.verdict.value,
        "seed": seed_scores,
        "scores": scores,
        "gate": decision.to_dict(),
    }


Scores = Callable[[list[Any], str], tuple[dict[str, float], dict[str, float]]]


def decide(
    users: list[Any], scores: Scores, looks: int
) -> tuple[GateResult, dict[str, float], dict[str, float]]:
    """The gate on `users` by the rule of `looks` (one look, or TwoLooks when it can stop early).

    `scores(part, look)`: {user id: objective} under the baseline and under the candidate for
    the users `part`, evaluated in the folder named `look` (`look_1`, `look_2`). Returns the
    decision and the scores of the users evaluated (half of them when look 1 decided).
    """
    rule = TwoLooks(len(users))
    two = looks == 2 and rule.can_stop_early
    first = users[: rule.first] if two else users
    s1, c1 = scores(first, "look_1")
    d1 = _diffs(c1, s1, first)
    if not two:
        return gate(d1), s1, c1
    early = rule.look_one(d1)
    if early is not None:
        return early, s1, c1
    rest = users[rule.first :]
    s2, c2 = scores(rest, "look_2")
    return rule.look_two(d1, _diffs(c2, s2, rest)), {**s1, **s2}, {**c1, **c2}


def _decide(
    ctx: RunContext,
    users: list[UserItem],
    seed: dict[str, str],
    prompts: dict[str, str],
    folder: Path,
    objective: str,
    *,
    name: str = "candidate",
    clients: Any = None,
) -> tuple[GateResult, dict[str, float], dict[str, float]]:
    """`prompts` against the seed on `users` by the run's rule (one look, or two)."""

    def scores(part: list[Any], look: str) -> tuple[dict[str, float], dict[str, float]]:
        return _scores(ctx, part, seed, prompts, folder / look, objective, name, clients)

    return decide(users, scores, ctx.config.confirm_looks)


def _diffs(candidate: dict[str, float], seed: dict[str, float], users: list[Any]) -> list[float]:
    """Per user in `users`' order with a value under both: candidate - seed."""
    return [candidate[u.id] - seed[u.id] for u in users if u.id in candidate and u.id in seed]


def _scores(
    ctx: RunContext,
    users: list[UserItem],
    seed: dict[str, str],
    candidate: dict[str, str],
    out: Path,
    objective: str,
    name: str = "candidate",
    clients: Any = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """{user: objective} of the seed and of `candidate` (folder `name`) on `users`.

    Whole episodes; `clients`: the candidate's own role clients (the null control's draw). The
    seed's folder is shared by the candidate and the null control (resumed, not run twice).
    """
    from memloop.feedback.evaluate import run_evaluation

    values = []
    for folder, prompts, drawn in (("seed", seed, None), (name, candidate, clients)):
        options = ctx._eval_options()
        if drawn is not None:
            options["clients"] = drawn
        result = run_evaluation(
            users,
            ctx.factory(prompts),
            out / folder,
            **options,
            label=f"{ctx.condition_label} confirmation: {folder}",
            group=CONFIRM_SPLIT,
        )
        values.append(per_user_values(result.metrics.get("per_user", {}), objective))
    return values[0], values[1]
