"""Optuna tuning of any policy's options over a declared search space.

- Search space: `search_space:` maps options of the policy YAML (any type, plug-ins included;
  `a.b` for a key inside a mapping) to a list of choices or a range (ints or floats, a step, a log
  scale); every value is checked against the policy's own validation before a trial runs. Without
  one, the paper's AWE grid over update_freq, short_term_len and top_k.

- Objective: `objective` (memory score by default, or state accuracy / memory gain) on the
  validation users (optionally a second objective, tokens per user, for a Pareto front). The best
  trial is then run once on the test users, which no trial saw: that is the headline, logged on
  the study's MLflow run.
- Several `memloop tune` processes may share one study (sqlite or any RDB storage): each trial
  sends a heartbeat, a trial whose process died is found by its silence (not "every RUNNING
  trial") and retried once by Optuna's RetryHeartbeatStaleTrialCallback.
- A trial stopped by Ctrl-C is run again, with the same params, by the next invocation
  (`requeue_interrupted`); the grid is "exhausted" only when every setting has a complete trial.
- A rerun continues the search: the `grid` sampler (default) takes each setting once, skipping
  those any earlier run or other worker finished or is running, and starts no trial when none is
  left (`nothing_to_draw`); `tpe` is reseeded with the number of trials so far, so it does not
  replay its first suggestions.
- A study remembers what it measures (environment, users, policy, endpoints, scorer): reopening it
  with other settings is refused, naming a new study instead. The MLflow experiment (by default
  the YAML's file name) is not one of them: a copied YAML naming the same study continues it,
  logging its new runs in its own experiment.
- Every trial's episodes are checkpointed in a folder named by its parameters, so a retried trial
  repeats no finished model call. Each trial is a nested MLflow run.
"""

from __future__ import annotations

import itertools
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from memloop.core import interrupt
from memloop.core.errors import UserError
from memloop.core.files import (
    atomic_savefig,
    atomic_write_json,
    json_sha256,
    safe_name,
    sqlite_file,
    store_lock,
)
from memloop.core.tables import format_table
from memloop.feedback.metrics import trial_metrics
from memloop.feedback.objective import LEGACY_OBJECTIVE, Objective
from memloop.optimize.config import TuneConfig
from memloop.optimize.context import (
    evaluation_settings,
    load_environment,
    resolve_reads,
    role_clients,
    split_users,
)
from memloop.policies.config import apply_params
from memloop.runs import tracker
from memloop.runs.cycles import OBJECTIVE_SECTION, Confirmation, cost_metrics, headline_values
from memloop.runs.recorder import Recorder, recording
from memloop.runs.spec import RunSpec, differences

OLD_IDENTITY_ATTR = "memloop.identity"  # before run specs: a key only
SPEC_ATTR = "memloop.run_spec"
INTERRUPTED_ATTR = "memloop.interrupted"  # system attribute of a trial stopped by Ctrl-C
RERUN_ATTR = "memloop.rerun_of"  # user attribute: the number of the interrupted trial it reruns


@dataclass
class TuneOutcome:
    study_name: str
    storage: str
    trials: list[dict[str, Any]]
    best: list[dict[str, Any]]
    added: int
    retried: int = 0  # trials of dead workers retried
    rerun: int = 0  # trials run again after a Ctrl-C
    test: dict[str, Any] | None = None  # the best trial on the test users
    pareto_plot: Path | None = None
    exhausted: bool = False
    notes: list[str] = field(default_factory=list)
    objective: Objective = LEGACY_OBJECTIVE  # what `trials[i]["objective"]` holds
    params: list[str] = field(default_factory=list)  # the searched options, in order
    plots: list[Path] = field(default_factory=list)  # Optuna's plots of the study
    # the best trial against the policy's own setting on the confirmation users
    confirmation: Confirmation | None = None


def _storage(config: TuneConfig):
    """The RDB storage with heartbeats.

    A trial silent for 2 x heartbeat_s is failed and retried once
    (RetryHeartbeatStaleTrialCallback), by whichever worker notices it.
    """
    import optuna

    sqlite = sqlite_file(config.storage) is not None

    class Storage(optuna.storages.RDBStorage):
        """Claims of waiting trials under a file lock, and no failed trial with half its params.

        sqlite has no SELECT ... FOR UPDATE, so two workers could both claim one waiting
        (enqueued or retried) trial.
        """

        def set_trial_state_values(self, trial_id, state, values=None):
            if state == optuna.trial.TrialState.FAIL:
                self._complete_params(trial_id)
            if not sqlite or state != optuna.trial.TrialState.RUNNING:
                return super().set_trial_state_values(trial_id, state, values)
            with store_lock(config.storage):
                return super().set_trial_state_values(trial_id, state, values)

        def _complete_params(self, trial_id) -> None:
            """Give a trial that failed before all its params were drawn the rest of them.

            A worker killed before or between suggestions leaves a trial with part of its
            params. The grid sampler then takes that finished prefix for a whole explored
            subtree (the settings below it are never tried) and crashes when the trial's retry
            completes the path. The missing params get each option's first value (listed in the
            system attribute `memloop.params_filled`): the failed trial stands for one setting,
            like any other.
            """
            have = self.get_trial(trial_id).params
            missing = [name for name in config.space if name not in have]
            for name in missing:
                distribution = to_distribution(config.space[name])
                first = distribution.to_internal_repr(space_values(config.space[name])[0])
                self.set_trial_param(trial_id, name, first, distribution)
            if missing:
                self.set_trial_system_attr(trial_id, "memloop.params_filled", missing)

    return Storage(
        config.storage,
        engine_kwargs={"connect_args": {"timeout": 60}} if sqlite else None,
        heartbeat_interval=config.heartbeat_s,
        grace_period=2 * config.heartbeat_s,
        heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
            max_retry=1
        ),
    )


def make_sampler(config: TuneConfig, trials_so_far: int):
    import optuna

    seed = config.seed * 100_003 + trials_so_far  # a rerun continues, it does not replay
    if config.sampler == "grid":
        return optuna.samplers.BruteForceSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


# what a study's trials' numbers do not depend on: the MLflow experiment its runs are logged in
# (by default the YAML's file name), so a copied YAML naming the same study continues it
NOT_STUDY_IDENTITY = ("experiment",)


def study_identity(identity: dict[str, Any]) -> dict[str, Any]:
    """A RunSpec identity without what is no part of a study's (`NOT_STUDY_IDENTITY`)."""
    return {k: v for k, v in identity.items() if k not in NOT_STUDY_IDENTITY}


def open_study(config: TuneConfig, spec: RunSpec):
    """The study (created or continued); refuses one made for other settings.

    The refusal is one line naming what changed (environment, users, policy, grid, ...): Optuna
    cannot change a parameter's choices within a study. A study none of whose trials finished
    takes the new settings instead.
    """
    import optuna

    directions: list[Literal["maximize", "minimize"]] = (
        ["maximize", "minimize"] if config.minimize_tokens else ["maximize"]
    )
    with store_lock(config.storage):  # two workers on a fresh sqlite file would both create it
        study = optuna.create_study(
            study_name=config.study_name,
            storage=_storage(config),
            load_if_exists=True,
            directions=directions,
        )
    if len(study.directions) != len(directions):
        raise UserError(
            f"{config.source}: key 'minimize_tokens': study {config.study_name} has "
            f"{len(study.directions)} objective(s); name a new study to change it"
        )
    found = study.user_attrs.get(SPEC_ATTR)
    if found is None and (study.trials or OLD_IDENTITY_ATTR in study.user_attrs):
        raise UserError(
            f"{config.source}: study {config.study_name!r} in {config.storage} was made by an "
            "older memloop (no run spec recorded); set `study:` to a new name"
        )
    # settings no trial finished under (every trial failed, e.g. on an undefined objective) ranked
    # nothing: new ones replace them, so following a failure's hint needs no new study name
    states = {t.state.name for t in study.trials}
    unused = not states & {"COMPLETE", "RUNNING", "WAITING"}
    if found is None or (unused and study_identity(found) != study_identity(spec.identity())):
        study.set_user_attr(SPEC_ATTR, spec.identity())
    elif study_identity(found) != study_identity(spec.identity()):
        changed = differences(study_identity(found), study_identity(spec.identity()))
        raise UserError(
            f"{config.source}: study {config.study_name!r} in {config.storage} was made with "
            f"other settings (changed: {', '.join(changed)}); set `study:` to a new name"
        )
    study.sampler = make_sampler(config, len(study.trials))
    return study


def requeue_interrupted(study) -> int:
    """Enqueue again, with the same params, every setting whose trial a Ctrl-C stopped.

    Optuna ends a trial whose objective raised KeyboardInterrupt (memloop's `Interrupted`, raised
    when the interrupt flag is set, is one) as FAIL, like any failed trial, and the grid sampler
    counts a failed trial as a tried setting: it never drew that setting again, and a rerun
    called the grid exhausted without it. So the objective marks such a trial with the system
    attribute `memloop.interrupted`, and each invocation starts by enqueueing the params of every
    marked trial whose setting has no complete, running or waiting trial (the caller holds the
    store lock: two workers starting together enqueue it once). Optuna runs waiting trials
    before it samples new ones; the rerun (user attribute `memloop.rerun_of`) finds the
    interrupted trial's finished episodes in its folder, which is named by its params, and
    repeats none of them.
    A trial that failed with an error is not rerun (it would fail again); a worker killed
    outright leaves its trial RUNNING, for the heartbeat retry. Returns how many were enqueued.
    """
    import optuna

    state = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)

    def key_of(params: dict[str, Any]) -> tuple:
        return tuple(sorted(params.items()))

    live = {
        key_of(t.system_attrs.get("fixed_params", t.params))
        for t in trials
        if t.state in (state.COMPLETE, state.RUNNING, state.WAITING)
    }
    added = 0
    for t in trials:
        key = key_of(t.params)
        if t.state == state.FAIL and t.system_attrs.get(INTERRUPTED_ATTR) and key not in live:
            study.enqueue_trial(dict(t.params), user_attrs={RERUN_ATTR: t.number})
            live.add(key)
            added += 1
    return added


def _setting(params: dict[str, Any], keys) -> tuple:
    return tuple(params.get(k) for k in keys)


def to_distribution(spec: Any):
    """Optuna's distribution for one option of the search space."""
    import optuna

    d = optuna.distributions
    if isinstance(spec, list):
        return d.CategoricalDistribution(spec)
    if spec.is_int:
        return d.IntDistribution(spec.low, spec.high, step=spec.step or 1, log=spec.log)
    return d.FloatDistribution(float(spec.low), float(spec.high), step=spec.step, log=spec.log)


def space_values(spec: Any) -> list[Any]:
    """The values of a choice list or a finite range, in order; a continuous range's ends."""
    if isinstance(spec, list):
        return list(spec)
    if spec.is_int:
        return list(range(spec.low, spec.high + 1, spec.step or 1))
    if spec.step is None:
        return [float(spec.low), float(spec.high)]
    count = int(round((spec.high - spec.low) / spec.step)) + 1
    values = [float(spec.low) + i * spec.step for i in range(count)]
    return [v for v in values if v <= spec.high + 1e-12]


def suggest(trial, space: dict[str, Any]) -> dict[str, Any]:
    """One value per option, drawn by the study's sampler, in the space's order."""
    params: dict[str, Any] = {}
    for key, spec in space.items():
        if isinstance(spec, list):
            params[key] = trial.suggest_categorical(key, spec)
        elif spec.is_int:
            params[key] = trial.suggest_int(
                key, spec.low, spec.high, step=spec.step or 1, log=spec.log
            )
        else:
            params[key] = trial.suggest_float(
                key, spec.low, spec.high, step=spec.step, log=spec.log
            )
    return params


def _same(setting: tuple) -> tuple:
    """`setting` with its floats rounded: a grid value and Optuna's record of it compare equal."""
    return tuple(round(v, 9) if isinstance(v, float) else v for v in setting)


def _grid(config: TuneConfig) -> list[tuple]:
    keys = list(config.space)
    return list(itertools.product(*(space_values(config.space[k]) for k in keys)))


def unfinished_settings(study, config: TuneConfig) -> list[tuple]:
    """The grid's settings with no complete trial, in the config's order."""
    import optuna

    keys = list(config.space)
    done = {
        _same(_setting(t.params, keys))
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    }
    return [s for s in _grid(config) if _same(s) not in done]


def nothing_to_draw(study, config: TuneConfig) -> bool:
    """Whether the grid sampler would only draw a setting again (a finished grid).

    That is: no trial waits, and every setting of the grid has a finished (complete, failed) or
    running trial. Asked for a trial then, Optuna's BruteForceSampler draws a random setting
    again and stops the study only after that trial has run: each rerun of a finished grid added
    a duplicate trial (and, on an endpoint that samples, the best setting became the best of
    several draws). So `Tuner.run` asks this before it starts the sampler. A dead worker's trial
    is failed first (its heartbeat retry then waits), as Optuna does before it asks for a trial.
    Always False for `tpe`, which has no end.
    """
    import optuna

    if config.sampler != "grid":
        return False
    optuna.storages.fail_stale_trials(study)
    state = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    if any(t.state == state.WAITING for t in trials):
        return False
    keys = list(config.space)
    taken = {_same(_setting(t.params, keys)) for t in trials}
    return all(_same(s) in taken for s in _grid(config))


def _folder(kind: str, params: dict[str, Any]) -> str:
    """A trial's folder: the policy's kind and its setting (AWE's paper grid: awe-2-4-30)."""
    return safe_name(f"{kind}-" + "-".join(str(v) for v in params.values()))


class Tuner:
    """One `memloop tune` invocation: objective on val users, the best trial on test users."""

    def __init__(
        self,
        config: TuneConfig,
        *,
        progress: bool = True,
        clients: Any = None,
        builder: Any = None,
    ):
        from memloop.policies import PluginConfig
        from memloop.runs.inputs import load_policy

        self.config = config
        self.progress = progress
        items, self.env_desc = load_environment(config.environment)
        self.users = split_users(items, config.environment, config.source)
        self.run_users = [i for split in self.users.values() for i in split]
        self.base = load_policy(config.policy, config.tracking_uri, self.run_users)
        self.kind = (
            safe_name(self.base.default_name)
            if isinstance(self.base, PluginConfig)
            else self.base.type
        )
        self.default = self.check_space()
        self.clients = clients or role_clients(config.endpoints)
        self.builder = builder
        self.added = 0  # trials this invocation finished (other workers add theirs)
        self.config, self.ranked_on, self.read_note = resolve_reads(config, self.clients)
        self.study_spec = self.spec()

    def spec(self) -> RunSpec:
        """The study's identity: what its trials' numbers depend on, the grid included."""
        from memloop.policies import policy_prompts

        config = self.config
        return RunSpec(
            kind="tune",
            experiment=config.experiment_name,
            environment=self.env_desc,
            users={s: [i.id for i in items] for s, items in self.users.items()},
            policy=self.base.model_dump(mode="json"),
            # the prompts it starts from: an edited default prompt is another study
            prompts_sha256=json_sha256(policy_prompts(self.base, self.clients.agent, self.builder)),
            endpoints=self.clients.identity(),
            evaluation={
                "rounds": config.rounds.model_dump(),
                "periods": config.environment.periods,
                # only when set: the keys of runs with the default (JSON) read stay
                **({"probes": config.probes.spec()} if config.probes.spec() else {}),
            },
            objective=self.ranked_on,
            optimizer={
                "name": "optuna",
                "study": config.study_name,
                "space": {
                    k: v if isinstance(v, list) else v.model_dump() for k, v in config.space.items()
                },
            },
        )

    def check_space(self) -> dict[str, Any] | None:
        """Every value of the search space on the policy; the first trial's setting.

        Each choice, and each end of a range, is set on the policy alone and validated as its
        YAML would be, so no trial fails on its setting. The first trial is `default_trial`, or
        else the policy YAML's own values when every one of them is in the space (None: none).
        """
        config, where = self.config, f"{self.config.source}: key 'search_space"
        for key, spec in config.space.items():
            for value in space_values(spec):
                apply_params(self.base, {key: value}, f"{where}.{key}' value {value!r}")
        if config.default_trial is not None:
            default = {k: config.default_trial[k] for k in config.space}
            for key, value in default.items():
                if not self.in_space(key, value):
                    raise UserError(
                        f"{config.source}: key 'default_trial.{key}': {value!r} is not in the "
                        "search space"
                    )
            return default
        own = self.policy_values()
        if all(own.get(k) is not None and self.in_space(k, own[k]) for k in config.space):
            return {k: own[k] for k in config.space}
        return None

    def policy_values(self) -> dict[str, Any]:
        """The policy YAML's value of each option of the space (None where it has none)."""
        from memloop.policies import PluginConfig

        data = self.base.options if isinstance(self.base, PluginConfig) else self.base.model_dump()
        out: dict[str, Any] = {}
        for key in self.config.space:
            value: Any = data
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            out[key] = value
        return out

    def in_space(self, key: str, value: Any) -> bool:
        spec = self.config.space[key]
        if isinstance(spec, list):
            return any(type(value) is type(c) and value == c for c in spec)  # True is not 1
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if spec.finite:
            return any(abs(value - v) < 1e-12 for v in space_values(spec))
        return spec.low <= value <= spec.high

    def policy_for(self, params: dict[str, Any]) -> Any:
        return apply_params(self.base, params, f"{self.config.source}: trial setting {params}")

    def trial_spec(self, params: dict[str, Any]) -> RunSpec:
        """A trial's identity: the study's, with the trial's setting in the policy."""
        policy = self.policy_for(params).model_dump(mode="json")
        return self.study_spec.model_copy(update={"kind": "tune_trial", "policy": policy})

    def evaluate(
        self,
        split: str,
        params: dict[str, Any],
        *,
        users: list[Any] | None = None,
        out: Path | None = None,
    ):
        """Whole episodes of `split`'s users (or `users`) under the setting `params`."""
        from memloop.feedback.evaluate import run_evaluation
        from memloop.policies import build_policy

        policy_config = self.policy_for(params)
        build = self.builder or build_policy
        return run_evaluation(
            self.users[split] if users is None else users,
            lambda uid, wd, c: build(policy_config, c, wd),
            out or self.config.output_root / split / _folder(self.kind, params),
            clients=self.clients,
            settings=evaluation_settings(self.config, self.progress, self.run_users),
            label=f"trial {_folder(self.kind, params)}",
            group=split,
        )

    def confirm_best(self, best: dict[str, Any]) -> Confirmation | None:
        """The best trial against the policy's own settings on the confirmation users, once.

        None without confirmation users. The declaration (confirm/trial_<n>/declared.json) is
        written before any confirmation episode; a rerun reads a finished decision back. A study
        grown later may name another best trial: it is declared and decided in its own folder,
        and the output counts the decisions these users have made.
        """
        from memloop.optimize.confirm import decide
        from memloop.runs.cycles import CONFIRM_DECISION, CONFIRM_SPLIT, per_user_values

        users = self.users.get(CONFIRM_SPLIT) or []
        if not users:
            return None
        params = {k: best[k] for k in self.config.space}
        root = self.config.output_root / "confirm"
        folder = root / f"trial_{best['number']}"
        path = folder / CONFIRM_DECISION
        if path.is_file():
            return Confirmation.model_validate_json(path.read_text())
        objective = self.ranked_on.value
        base = {
            "candidate": best["number"],
            "rule": "the best validation trial",
            "objective": objective,
            "users": [u.id for u in users],
            "looks": self.config.confirm_looks,
        }
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / "declared.json", {**base, "params": params})
        own = self.policy_for({}).model_dump(mode="json")
        if self.policy_for(params).model_dump(mode="json") == own:
            result = Confirmation(**base, verdict=Confirmation.IDENTICAL)
            atomic_write_json(path, result.model_dump(mode="json"))
            return result

        def scores(part: list[Any], look: str) -> tuple[dict[str, float], dict[str, float]]:
            out = []
            for name, setting in (("defaults", {}), ("best", params)):
                result = self.evaluate(CONFIRM_SPLIT, setting, users=part, out=folder / look / name)
                out.append(per_user_values(result.metrics.get("per_user", {}), objective))
            return out[0], out[1]

        decision, s1, c1 = decide(users, scores, self.config.confirm_looks)
        result = Confirmation(
            **base, verdict=decision.verdict.value, seed=s1, scores=c1, gate=decision.to_dict()
        )
        atomic_write_json(path, result.model_dump(mode="json"))
        return result

    def run(self) -> TuneOutcome:
        import optuna

        config = self.config
        if self.read_note:
            print(self.read_note, flush=True)
        # ERROR: a failed trial is memloop's one line, not Optuna's warning with its traceback
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        study = open_study(config, self.study_spec)
        names = [self.ranked_on.value, "tokens_per_user"][: len(study.directions)]
        if study.metric_names != names:
            study.set_metric_names(names)  # Optuna's plots and dashboard name the objectives
        # under the lock: two workers starting together would both enqueue a trial
        with store_lock(config.storage):
            requeue_interrupted(study)  # a trial stopped by Ctrl-C first
            if self.default is not None:  # then the policy's own setting
                study.enqueue_trial(self.default, skip_if_exists=True)

        with recording(
            config.tracking_uri,
            config.experiment_name,
            self.study_spec,
            f"tune-{config.study_name}",
            tags={"memloop.study": config.study_name},
        ) as study_run:
            return self._run(study, study_run)

    def _run(self, study: Any, study_run: Recorder) -> TuneOutcome:
        config = self.config
        if not nothing_to_draw(study, config):  # a finished grid adds no trial
            study.optimize(
                lambda trial: self.objective(trial, study_run),
                n_trials=config.trials,
                gc_after_trial=False,
                show_progress_bar=False,
            )
        outcome = summarize_study(study, config, self.added, self.ranked_on, self.default)
        if config.sampler == "grid":
            # every setting has a complete trial; the sampler also stops when the rest failed
            unfinished = unfinished_settings(study, config)
            outcome.exhausted = not unfinished
            if unfinished and self.added < config.trials:
                outcome.notes.append(
                    f"the grid sampler has no setting left to draw, but {len(unfinished)} "
                    f"setting(s) ({', '.join(config.space)}) have no complete trial "
                    "(failed, or running in another worker): " + ", ".join(map(str, unfinished))
                )
        if outcome.best:
            outcome.test = self.test_best(outcome.best[0], study_run)
            outcome.confirmation = self.confirm_best(outcome.best[0])
            if outcome.confirmation is not None:
                self.log_confirmation(outcome, study_run)
            optuna_best = optuna_best_number(study)
            if optuna_best is not None and optuna_best != outcome.best[0]["number"]:
                outcome.notes.append(
                    f"Optuna's best_trial is trial {optuna_best} (the first of the tied best); "
                    f"memloop names trial {outcome.best[0]['number']}: ties go to the policy's "
                    "own setting, then the smallest setting, so the order in which trials "
                    "finished does not change the best"
                )
        if outcome.trials:
            outcome.plots = study_plots(study, outcome, config.output_root)
            study_run.figures(outcome.plots)
            if config.minimize_tokens:
                outcome.pareto_plot = config.output_root / "pareto.png"
        return outcome

    def objective(self, trial, study_run: Recorder):
        """The trial's objective; a Ctrl-C marks the trial for a rerun (`requeue_interrupted`)."""
        try:
            return self._objective(trial, study_run)
        except BaseException as e:
            # the flag too: an interrupted worker thread's error may arrive wrapped in another
            if interrupt.by_user(e):
                trial.storage.set_trial_system_attr(trial._trial_id, INTERRUPTED_ATTR, True)
            raise

    def _objective(self, trial, study_run: Recorder):
        config = self.config
        params = suggest(trial, config.space)
        name = f"trial-{trial.number}-{_folder(self.kind, params)}"
        tags = {"memloop.study": config.study_name, "memloop.trial": str(trial.number)}
        if RERUN_ATTR in trial.user_attrs:
            tags[RERUN_ATTR] = str(trial.user_attrs[RERUN_ATTR])
        objective = self.ranked_on
        with recording(
            config.tracking_uri,
            config.experiment_name,
            self.trial_spec(params),
            name,
            tags=tags,
            parent=study_run,
        ) as rec:
            system = trial.storage.get_trial_system_attrs(trial._trial_id)
            if rec.resumed and (RERUN_ATTR in tags or "failed_trial" in system):
                # the run the trial it reruns opened (stopped by Ctrl-C, or its worker died,
                # retried by Optuna's heartbeat callback): named after this trial, the number of
                # the table
                rec.rename(name, tags)
            started = time.perf_counter()
            result = self.evaluate("val", params)
            m = result.metrics
            tokens = sum(m["usage"].values()) / max(1, m["users"])
            if m[objective] is None:
                # The upper bound depends on the users and the endpoint, not on the trial: every
                # trial would be undefined too, so no choice between them can be made.
                raise UserError(
                    f"the {objective} is undefined on the {m['users']} validation users (the "
                    "upper bound never beats random on them): no trial can be ranked; add "
                    "validation users, use a stronger agent model, or rank on "
                    "`--objective state_accuracy`"
                )
            score = m[objective]
            for key in trial_metrics():
                trial.set_user_attr(key, m[key])
            trial.set_user_attr("tokens_per_user", tokens)
            trial.set_user_attr("health", result.health.line("val users"))
            trial.set_user_attr("run_id", rec.run_id)
            link_trial_to_run(trial, rec.experiment_id, rec.run_id)
            rec.metrics(
                {
                    **{f"val/{k}": m[k] for k in trial_metrics()},
                    **{f"val/{k}": v for k, v in m["diagnosis"].items()},
                    "val/tokens_per_user": tokens,
                    **{f"tokens/{c}": float(v) for c, v in m["usage"].items()},
                    **cost_metrics(m.get("cost_usd") or {}),
                    **{f"val/{k}": v for k, v in result.health.metrics().items()},
                    "time/seconds": time.perf_counter() - started,
                },
                step=0,
            )
        # the objective per trial, drawn first (the capital section), as evolve's per cycle
        study_run.metrics(
            {f"val/{objective}": score, f"{OBJECTIVE_SECTION}/val_{objective}": score},
            step=trial.number,
        )
        self.added += 1
        return (score, tokens) if config.minimize_tokens else score

    def log_confirmation(self, outcome: TuneOutcome, study_run: Recorder) -> None:
        """The decision as the study run's artifact and tags; how many these users made."""
        from memloop.runs.cycles import CONFIRM_ARTIFACT, CONFIRM_DECISION

        c = outcome.confirmation
        assert c is not None
        study_run.text(
            c.model_dump_json(indent=1),
            f"{CONFIRM_ARTIFACT}/trial_{c.candidate}/{CONFIRM_DECISION}",
        )
        tags = {"memloop.verdict": c.verdict}
        if c.gate is not None:
            tags["memloop.gate"] = (
                f"trial {c.candidate} vs the policy's own setting on {c.gate['n']} "
                f"confirmation users: {c.gate['verdict']}, mean {c.gate['mean']:+.3f}, "
                f"p {c.gate['sign_flip_p']:.3g}, level {c.gate['level']:.3g}"
            )
        study_run.tags(tags)
        made = sorted((self.config.output_root / "confirm").glob("trial_*/decision.json"))
        if len(made) > 1:
            outcome.notes.append(
                f"these confirmation users have now decided on {len(made)} best trials (the "
                "study grew between invocations); each decision is at 0.05, so together they "
                "claim less: for a new claim, add fresh confirmation users"
            )

    def test_best(self, best: dict[str, Any], study_run: Recorder) -> dict[str, Any] | None:
        """The best trial (by validation score) run on the test users; logged on the parent."""
        if not self.users["test"]:
            return None
        params = {k: best[k] for k in self.config.space}
        m = self.evaluate("test", params).metrics
        row = {
            "trial": best["number"],
            **params,
            **{k: m[k] for k in (*trial_metrics(), "users")},
        }
        # the best trial's test numbers as the run's tags (a grown study may name another best
        # trial): numbers to read on the run's page, not one-point charts
        values = {
            **{k: m[k] for k in trial_metrics()},
            **m["diagnosis"],
            "users": m["users"],
        }
        tags = headline_values(values)
        tags["headline.trial"] = str(best["number"])
        setting = ", ".join(f"{k} {params[k]}" for k in params)
        shown = tags.get(f"headline.test_{self.ranked_on}", "n/a")
        tags[tracker.DESCRIPTION_TAG] = (
            f"**tune {self.config.study_name}**: best trial {best['number']} ({setting}) on "
            f"validation; on {m['users']} test users {self.ranked_on} {shown}."
        )
        study_run.tags(tags)
        atomic_write_json(self.config.output_root / "test_best.json", row)
        return row


def run_tune(
    config: TuneConfig, *, progress: bool = True, clients: Any = None, builder: Any = None
) -> TuneOutcome:
    """Add `config.trials` trials to the study, then test its best trial.

    `clients` and `builder` (replacing policies.build_policy) are for tests. Optuna's warnings
    that heartbeats and the brute-force sampler are "experimental" are not shown.
    """
    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return Tuner(config, progress=progress, clients=clients, builder=builder).run()


def optuna_best_number(study) -> int | None:
    """Optuna's own `study.best_trial` number (single objective; None otherwise or none)."""
    if len(study.directions) != 1:
        return None
    try:
        return int(study.best_trial.number)
    except ValueError:  # no complete trial
        return None


def summarize_study(
    study,
    config: TuneConfig,
    added: int,
    objective: Objective = LEGACY_OBJECTIVE,
    default: dict[str, Any] | None = None,
) -> TuneOutcome:
    """The study's complete trials and its best.

    The best is the top trial, or Optuna's Pareto front (`study.best_trials`) when tokens per
    user is the second objective.
    """
    import optuna
    from optuna.storages import RetryHeartbeatStaleTrialCallback as Retry

    keys = list(config.space)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    rows = [
        {
            "number": t.number,
            **t.params,
            "memory_score": t.user_attrs.get("memory_score"),
            "objective": t.values[0],
            "tokens_per_user": t.user_attrs.get("tokens_per_user"),
            "overall": t.user_attrs.get("overall"),
            "factual_recall": t.user_attrs.get("factual_recall"),
            "health": t.user_attrs.get("health"),
        }
        for t in done
    ]
    first = None if default is None else _setting(default, keys)

    def rank(r: dict[str, Any]) -> tuple:
        # ties go to the default setting, then the smallest, not to the earliest trial: the
        # order of the trials (a rerun after Ctrl-C, other workers) does not change the best
        setting = _setting(r, keys)
        ordered = tuple((type(v).__name__, v) for v in setting)
        return (-r["objective"], setting != first, ordered)

    if len(study.directions) == 1:
        best = sorted(rows, key=rank)[:1]
    else:
        best_numbers = {t.number for t in study.best_trials} if done else set()
        best = sorted((r for r in rows if r["number"] in best_numbers), key=rank)
    retried = sum(1 for t in study.trials if Retry.retried_trial_number(t) is not None)
    rerun = sum(1 for t in done if RERUN_ATTR in t.user_attrs)
    return TuneOutcome(
        config.study_name,
        config.storage,
        rows,
        best,
        added,
        retried,
        rerun,
        objective=objective,
        params=keys,
    )


def link_trial_to_run(trial, experiment_id: str, run_id: str) -> None:
    """The trial's note on optuna-dashboard: a link to its MLflow run.

    The link is to `memloop ui`'s default address; the note also gives the run's page path, for
    a UI served elsewhere.
    """
    from optuna_dashboard import save_note

    from memloop.core.settings import UI_PORT

    page = f"#/experiments/{experiment_id}/runs/{run_id}"
    save_note(
        trial,
        f"MLflow run: [{run_id}](http://127.0.0.1:{UI_PORT}/{page}) (served by `memloop ui` on "
        f"its default port; elsewhere, `{page}` at the UI's address)",
    )


def study_plots(study, outcome: TuneOutcome, folder: Path) -> list[Path]:
    """Optuna's own plots of the study, as PNG files in `folder` (each written atomically).

    The Pareto front (with tokens per user as the second objective) or the optimization
    history, each option's values against the objective (`plot_slice`), and, once finished
    trials differ in their objective, each option's importance for it (`plot_param_importances`:
    Optuna's fANOVA, seeded, so the same trials give the same figure).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna
    from optuna.visualization import matplotlib as oplt

    folder.mkdir(parents=True, exist_ok=True)
    names = [f"validation {outcome.objective.label}", "tokens per user"]
    figures: dict[str, Any] = {}
    if len(study.directions) == 2:
        figures["pareto.png"] = oplt.plot_pareto_front(study, target_names=names)
    else:
        figures["history.png"] = oplt.plot_optimization_history(study, target_name=names[0])
    first_value = (lambda t: t.values[0]) if len(study.directions) == 2 else None
    figures["slice.png"] = oplt.plot_slice(
        study, params=outcome.params, target=first_value, target_name=names[0]
    )
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    # fANOVA has nothing to apportion when every trial scored the same (and raises)
    if len({t.values[0] for t in finished}) >= 2 and outcome.params:
        from optuna.importance import FanovaImportanceEvaluator

        figures["importance.png"] = oplt.plot_param_importances(
            study,
            evaluator=FanovaImportanceEvaluator(seed=0),
            params=outcome.params,
            target=first_value,
            target_name=names[0],
        )
    written = []
    for name, axes in figures.items():
        first = axes.flat[0] if hasattr(axes, "flat") else axes
        fig: Any = first.figure
        fig.suptitle(f"study {outcome.study_name}", fontsize=9)
        fig.set_size_inches(
            max(6.0, 3.2 * len(outcome.params)) if name == "slice.png" else 6.4, 4.2
        )
        # matplotlib's layout warnings ("not applied", "Axes that are not compatible with
        # tight_layout") on Optuna's figures are not the user's to act on
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            fig.tight_layout()
        atomic_savefig(fig, folder / name, dpi=110)
        plt.close(fig)
        written.append(folder / name)
    return written


def trials_health(trials: list[dict[str, Any]]) -> str:
    """One line: the trials whose writer tripped a memory-health alarm (feedback/health.py)."""
    alarmed = [
        f"trial {r['number']}: {r['health'].removeprefix('memory health: ALARM ')}"
        for r in trials
        if "ALARM" in (r.get("health") or "")
    ]
    if alarmed:
        return "memory health: ALARM in " + "; ".join(alarmed)
    return "memory health: no alarm in any trial (validation users)"


def format_outcome(outcome: TuneOutcome, fmt: str = "table") -> str:
    """The study's trials on the validation users (the objective first), then its best trial.

    `fmt`: aligned text within 100 columns (`table`), the trials' table alone as CSV (`csv`), or
    Markdown (`md`). An undefined number is `n/a`.
    """
    from memloop.core.tables import format_number, wrap_prose
    from memloop.feedback.metrics import metric_column

    objective = outcome.objective.value
    best = {r["number"] for r in outcome.best}
    rows = [
        [
            f"{r['number']}{'*' if r['number'] in best else ''}",
            *(r.get(k) for k in outcome.params),
            r["objective"],
            r.get("overall"),
            r.get("factual_recall"),
            None if r.get("tokens_per_user") is None else round(r["tokens_per_user"]),
        ]
        for r in outcome.trials
    ]
    headers = [
        "trial",
        *outcome.params,
        metric_column(objective, objective=True),
        metric_column("overall"),
        metric_column("factual_recall"),
        "tokens/user",
    ]
    table = format_table(headers, rows, align="r" * len(headers), fmt=fmt)
    if fmt == "csv":
        return table
    head = (
        f"study {outcome.study_name} ({outcome.storage}): {len(outcome.trials)} finished "
        f"trials, {outcome.added} added now"
    )
    if outcome.retried:
        head += f", {outcome.retried} retried after their worker died"
    if outcome.rerun:
        head += f", {outcome.rerun} run again after a Ctrl-C"
    lines = [
        head,
        "each trial on the validation users:",
        table,
        "* best trial(s) on validation users"
        + (f" (Pareto front: {metric_column(objective)} vs tokens)" if len(best) > 1 else ""),
    ]
    lines.append(trials_health(outcome.trials))
    if outcome.exhausted:
        lines.append("the grid is exhausted: every setting has a complete trial")
    lines.extend(outcome.notes)
    if outcome.test is not None:
        t = outcome.test
        others = ("memory_score", "overall", "factual_recall")
        shown = [objective, *(m for m in others if m != objective)]
        numbers = ", ".join(f"{metric_column(m)} {format_number(t.get(m))}" for m in shown)
        lines.append(
            f"best trial {t['trial']} ({', '.join(str(t[k]) for k in outcome.params)}) "
            f"on {t['users']} test users: {numbers}"
        )
    c = outcome.confirmation
    if c is None:
        lines.append(
            "tune cannot decide: its best trial is chosen on validation users, and no gate "
            "compares it with the policy's own setting on fresh users (environment."
            "confirm_users); the numbers above claim no improvement"
        )
    elif c.gate is None:
        lines.append(
            f"confirmation: best trial {c.candidate} is the policy's own setting "
            f"({c.verdict}); nothing to decide"
        )
    else:
        from memloop.core.stats import decision_text

        lines.append(
            f"confirmation: best trial {c.candidate} - the policy's own setting on "
            f"{len(c.scores)} fresh users: {decision_text(c.gate)}"
        )
    if outcome.plots:
        lines.append("Optuna's plots: " + ", ".join(str(p) for p in outcome.plots))
    if fmt == "md":
        return "\n\n".join(lines)
    return "\n".join(line if line in (head, table) else wrap_prose(line) for line in lines)
