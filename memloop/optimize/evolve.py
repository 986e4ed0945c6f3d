"""`memloop evolve`: every condition of an experiment, each a RunContext run by its search.

Each condition runs `repeats` times; repeat r > 0 draws its own answers from the agent and the
simulated user (`RoleClients.with_draw`), and repeat 0 is the run without repeats.

The search is the config's `search:` (optimize/registry.py); the no-evolution baseline of a search
that evolves itself (GEPA) runs as the episode search, which evaluates the initial prompts each
cycle on the same users.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.tables import printable
from memloop.llm.roles import RoleClients
from memloop.optimize import registry
from memloop.optimize.config import EvolveConfig
from memloop.optimize.context import (
    RunContext,
    RunOutcome,
    load_environment,
    role_clients,
    split_users,
)
from memloop.optimize.contract import Search


def _search(config: EvolveConfig, name: str) -> Search:
    base = Path(config.source).parent if config.source else None
    try:
        return registry.build_search(name, config.settings.get(name), base)
    except UserError as exc:
        raise UserError(f"{config.source or 'config'}: {exc}") from None


def conditions(config: EvolveConfig) -> list[tuple[str, str, Search]]:
    """(feedback mode, evolver, search) of every run of `config`.

    Every name and its settings are resolved here, before a client starts or a file is written.
    """
    search = _search(config, config.search)
    if search.evolves_itself and "evolvers" in config.model_fields_set:
        raise UserError(
            f"{config.source or 'config'}: key 'evolvers': search {search.name} evolves the "
            "prompts itself; drop the evolvers key"
        )
    out = []
    base = Path(config.source).parent if config.source else None
    for mode, evolver in config.conditions(evolves_itself=search.evolves_itself):
        chosen = (
            _search(config, "episode") if search.evolves_itself and evolver == "none" else search
        )
        if not search.evolves_itself:
            try:
                cls = registry.optimizer_class(evolver, "evolver", "evolvers", base)
                registry.settings(cls, config.settings.get(evolver), f"settings.{evolver}")
            except UserError as exc:
                raise UserError(f"{config.source or 'config'}: {exc}") from None
        out.append((mode, evolver, chosen))
    unused = set(config.settings) - {config.search, *config.evolvers}
    if unused:
        raise UserError(
            f"{config.source or 'config'}: key 'settings': {', '.join(sorted(unused))} is not "
            f"an optimizer of this experiment (search {config.search}, evolvers "
            f"{', '.join(config.evolvers)})"
        )
    return out


def cannot_decide(config: EvolveConfig) -> str | None:
    """Why no outcome of `config`'s runs can pass the gate, or None when one can.

    With confirmation users one candidate is tested at ALPHA on them; without, the best of the
    evolved cycles at ALPHA / (cycles - 1) on the validation users (core/stats.min_users).
    """
    from memloop.core.stats import ALPHA, min_users

    env = config.environment
    if env.confirm_users:
        need = min_users(ALPHA)
        if env.confirm_users >= need:
            return None
        return f"{env.confirm_users} confirmation user(s), and the gate needs {need}"
    candidates = max(1, config.cycles - 1)
    need = min_users(ALPHA / candidates)
    if env.val_users >= need:
        return None
    return (
        f"{env.val_users} validation user(s) and no confirmation users, and the gate needs {need} "
        f"for a choice among {candidates} cycle(s)"
    )


def screen_cannot_decide(config: EvolveConfig) -> str | None:
    """Why the edits evolver's replay screen can never say `improved`, or None when it can.

    Its gate tests the best of `candidates` edits at ALPHA / candidates on the training users
    (core/stats.min_users: 8 users for 5 candidates); below that a step is an exploration step
    at most (`screen_takes: explore`), never a decision.
    """
    from memloop.core.stats import ALPHA, min_users
    from memloop.optimize.evolvers.edits import EditsSettings

    if "edits" not in config.evolvers:
        return None
    candidates = EditsSettings(**config.settings.get("edits", {})).candidates
    need = min_users(ALPHA / candidates)
    have = config.environment.train_users
    if have >= need:
        return None
    return (
        f"{have} training user(s), and the gate needs {need} to choose among {candidates} "
        "candidate edits"
    )


def run_evolve(
    config: EvolveConfig,
    *,
    progress: bool = True,
    clients: RoleClients | None = None,
    builder: Any = None,
) -> list[RunOutcome]:
    """Every condition of `config` in turn; `builder` replaces policies.build_policy (tests).

    Bad input (unknown search, splits larger than the environment, a search that needs
    validation users without any) is refused before a client starts or a file is written.
    """
    chosen = conditions(config)
    environment = load_environment(config.environment)  # once, for every condition
    users = split_users(environment[0], config.environment, config.source)
    for _, _, search in chosen:
        if search.needs_val and not users["val"]:
            raise UserError(
                f"{config.source or 'config'}: key 'environment.val_users': search "
                f"{search.name} selects on validation users; set val_users to at least 1"
            )
    clients = clients or role_clients(config.endpoints)
    if config.repeats > 1 and not clients.sampled():
        raise UserError(
            f"{config.source or 'config'}: key 'repeats': {config.repeats} repeats would draw the "
            "same answers: the agent and user_sim endpoints both have temperature 0 (give one of "
            "them an endpoint file with temperature > 0, or set repeats: 1)"
        )
    runs = [
        (
            RunContext(
                config,
                mode,
                evolver,
                search,
                clients=clients.with_draw(repeat) if repeat else clients,
                progress=progress,
                builder=builder,
                environment=environment,
                repeat=repeat,
            ),
            search,
        )
        for mode, evolver, search in chosen
        for repeat in range(config.repeats)
    ]
    reason = cannot_decide(config)
    if reason is not None:
        print(
            f"this experiment cannot decide: {reason}; whatever it finds, the seed stands "
            "(26 fresh confirmation users detect +0.03 state_prob at 90% power: --confirm-users "
            "26, or environment.confirm_users in the YAML)",
            flush=True,
        )
    if runs and runs[0][0].read_note:
        print(runs[0][0].read_note, flush=True)
    screen = screen_cannot_decide(config)
    if screen is not None:
        print(
            f"the edits evolver's screen cannot decide: {screen}; its steps are exploration "
            "steps at most",
            flush=True,
        )
    outcomes = []
    for ctx, search in runs:
        again = f" repeat={ctx.repeat}" if config.repeats > 1 else ""
        print(
            f"== {printable(config.experiment_name)}: feedback={ctx.mode} "
            f"evolver={printable(ctx.evolver_name)} "
            f"search={search.name}{again}",
            flush=True,
        )
        finished = ctx.store.finished()
        if finished:  # a rerun: say what it found before it goes on
            print(
                f"   resuming {ctx.run_dir}: cycle(s) 0-{finished - 1} already finished "
                "(read back, not run again)",
                flush=True,
            )
        outcome = ctx.run(search.cycles(ctx))
        log_run_figure(ctx, outcome)
        outcomes.append(outcome)
    return outcomes


FIGURE_STEM = "cycles"  # figures/cycles.png and .svg in the run folder and in MLflow
# PNG to look at, SVG to edit (compare --plot and the quickstart also write a PDF)
FIGURE_FORMATS = (".png", ".svg")


def log_run_figure(ctx: RunContext, outcome: RunOutcome) -> list[Path]:
    """The run's figure, written to its folder's `figures/` and logged to its run's `figures/`.

    plots.plot_cycles of the run's own cycles on its headline split (each file written to a
    temporary file and renamed into place), logged to the MLflow run (ended by then) by its id.
    Once per run, after its last cycle. A rerun draws it again when a format is missing, empty
    or cut (`plots.figure_complete`: a process killed by an older memloop while it wrote) or a
    cycle record is newer than it, and logs it again when the MLflow run lacks one of its files
    (killed before or while they were logged). Returns the files drawn or logged now.
    """
    if not outcome.cycles:
        return []
    from memloop.results.plots import figure_complete, figure_paths
    from memloop.runs import tracker

    png = outcome.run_dir / "figures" / f"{FIGURE_STEM}.png"
    paths = figure_paths(png, FIGURE_FORMATS)
    records = [ctx.store.record_file(c.cycle) for c in outcome.cycles]
    drawn = all(figure_complete(p) for p in paths) and all(
        r.stat().st_mtime_ns <= p.stat().st_mtime_ns for r in records for p in paths
    )
    mlc = tracker.client(ctx.config.tracking_uri)
    if drawn:
        if tracker.has_figures(mlc, outcome.run_id, paths):
            return []  # a rerun that added no cycle: the figure drawn and logged before stands
        tracker.log_figure(mlc, outcome.run_id, paths)
        return paths
    from memloop.results.compare import curves
    from memloop.results.plots import plot_cycles
    from memloop.results.rows import headline_split

    history = curves(
        outcome.mode,
        outcome.evolver,
        outcome.cycles,
        headline_split(outcome.cycles),
        model=ctx.spec.endpoints.get("agent", {}).get("model"),
        selection=outcome.selection,
        objective=ctx.objective,
        repeat=outcome.repeat,
    )
    title = printable(f"{ctx.config.experiment_name}: {ctx.name}")
    paths = plot_cycles([history], png, title, formats=FIGURE_FORMATS)
    tracker.log_figure(mlc, outcome.run_id, paths)
    return paths
