"""`memloop transfer`: does a run's selected prompt keep its gain under other writer models?

A prompt evolved for one model is often deployed with another (gepa #266). For each writer (an
agent endpoint: the model that writes memory, replies and answers the probes), the run's
selected prompts and its seed prompts are evaluated on the run's test users (its confirmation
users when it has none), with the run's
policy, periods, rounds, probes and other roles, and paired user by user: per writer the
difference selected - seed with n, the t interval, the exact sign-flip p, users up / tied / down
and the gate's verdict at 0.05 (one pre-declared candidate: the run's selection). When the
selection is the seed (same prompts and settings), no cell is evaluated: every row says `same
prompt`.

Each evaluated cell is an eval run in MLflow (experiment `transfer`, `log_eval`): tagged with
the run, the writer and the arm; both arms of a writer share `memloop.like`, so `memloop compare
--experiment transfer` pairs them too. The matrix is written to `--out` as `transfer.json`, and
each cell's folder under it resumes when interrupted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json, safe_name
from memloop.core.stats import Paired, decision_text, gate_of

TRANSFER_EXPERIMENT = "transfer"
ARMS = ("seed", "selected")


@dataclass
class TransferRow:
    writer: str  # the endpoint's model name (and where, for a served one)
    same_prompt: bool
    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # arm -> user -> value
    runs: dict[str, str] = field(default_factory=dict)  # arm -> MLflow run name
    folders: dict[str, str] = field(default_factory=dict)  # arm -> its cell's eval folder

    @cached_property  # read once the scores are in (cells, to_dict): the exact test runs once
    def paired(self) -> Paired | None:
        if self.same_prompt:
            return None
        return Paired.of(self.scores["selected"], self.scores["seed"])

    @cached_property
    def gate(self) -> dict[str, Any] | None:
        if self.same_prompt:
            return None
        return gate_of(self.scores["selected"], self.scores["seed"]).to_dict()

    def cells(self) -> list[Any]:
        if self.same_prompt:
            return [self.writer, "same prompt", "", "", "", "", "", "", "-"]
        paired, gate = self.paired, self.gate
        assert paired is not None and gate is not None
        means = [sum(v.values()) / len(v) if v else None for v in map(self.scores.get, ARMS)]
        return [self.writer, *means, *paired.cells(), gate["verdict"]]

    def to_dict(self) -> dict[str, Any]:
        paired, gate = self.paired, self.gate
        return {
            "writer": self.writer,
            "same_prompt": self.same_prompt,
            "scores": self.scores,
            "paired": None if paired is None else paired.to_dict(),
            "gate": gate,
            "gate_text": None if gate is None else decision_text(gate),
            "runs": self.runs,
            "folders": self.folders,
        }


def _factory(config: Any, prompts: dict[str, str]) -> Any:
    """A policy factory: `config` writing with `prompts`."""
    from memloop.policies import build_policy

    return lambda uid, workdir, client: build_policy(config, client, workdir, prompts=prompts)


def writer_endpoint(ref: str) -> Any:
    """An endpoint from `--writer`: an endpoint YAML, or an embedded model's name."""
    from memloop.llm.endpoint import Endpoint, load_endpoint

    shipped = Path(__file__).resolve().parent.parent / "experiments" / "endpoints"
    names = {"local-1.5b": shipped / "local.yaml", "local-0.5b": shipped / "local-0.5b.yaml"}
    if ref in names:
        return load_endpoint(str(names[ref]))
    if not Path(ref).is_file():
        raise UserError(
            f"--writer {ref}: neither an endpoint file nor an embedded model ({', '.join(names)})"
        )
    endpoint = load_endpoint(ref)
    assert isinstance(endpoint, Endpoint)
    return endpoint


def _label(endpoint: Any) -> str:
    return endpoint.model if endpoint.is_local else f"{endpoint.model} at {endpoint.base_url}"


def run_transfer(
    folder: Path,
    writers: list[str],
    out: Path,
    *,
    tracking_uri: str,
    env: str | None = None,
    cycle: int | None = None,
    prompts_file: Path | None = None,
    cache: Any = "default",
    progress: bool = True,
) -> list[TransferRow]:
    """The transfer matrix of the run in `folder` under `writers` (see the module docstring).

    `cycle`: that cycle's prompts instead of the selection's; `prompts_file`: a prompt file
    (`memloop export`'s text, a mem0 config, a DSPy program.json, as `prompts_from:` reads it)
    against the run's seed instead.
    """
    from memloop.feedback.objective import LEGACY_OBJECTIVE
    from memloop.optimize.export_check import evaluate_as_run, run_endpoints, run_test_users
    from memloop.policies import parse_policy_config
    from memloop.results.export import from_folder
    from memloop.runs.cycles import per_user_values
    from memloop.runs.eval_log import log_eval
    from memloop.runs.folder import read_spec
    from memloop.runs.inputs import roles

    if not writers:
        raise UserError("give at least one --writer (an endpoint file, local-0.5b or local-1.5b)")
    folder = Path(folder)
    spec = read_spec(folder, option="RUN")
    if spec is None:
        raise UserError(f"{folder}: not a run folder (no spec.json); give an evolve run's folder")
    selected = from_folder(folder, cycle)  # the run's selection unless `cycle` names another
    seed = from_folder(folder, 0)
    arms = {"seed": seed.prompts, "selected": selected.prompts}
    if prompts_file is not None:
        from memloop.policies.prompt_files import read_prompt_file

        arms["selected"] = {**seed.prompts, **read_prompt_file(Path(prompts_file))}
    same = arms["seed"] == arms["selected"]
    objective = spec.objective or LEGACY_OBJECTIVE
    items = run_test_users(spec, env, option="transfer", splits=("test", "confirm"))
    endpoints = run_endpoints(spec, None)
    base = {k: v for k, v in spec.policy.items() if v is not None and k != "prompts"}
    config = parse_policy_config(base, "the run's policy (spec.json)")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for ref in writers:
        endpoint = writer_endpoint(ref)
        row = TransferRow(_label(endpoint), same)
        rows.append(row)
        if same:
            continue
        clients = roles(
            endpoint,
            endpoints.get("user_sim"),
            endpoints.get("checker"),
            endpoints.get("optimizer"),
            cache=cache,
        )
        clients.preflight()
        for arm, prompts in arms.items():
            cell = out / safe_name(f"{row.writer}-{arm}")
            result, cell_spec = evaluate_as_run(
                spec,
                items,
                clients,
                config,
                prompts,
                _factory(config, prompts),
                cell,
                source=f"transfer-{arm}:{selected.run}",
                command="memloop transfer",
                label=f"transfer {row.writer} ({arm})",
                progress=progress,
            )
            row.folders[arm] = str(cell)
            row.scores[arm] = per_user_values(result.metrics.get("per_user", {}), objective)
            _, row.runs[arm] = log_eval(
                tracking_uri,
                TRANSFER_EXPERIMENT,
                cell_spec,
                policy=config.display_name,
                objective=objective,
                prompts=prompts,
                result=result,
                out=cell,
                tags={
                    "memloop.transfer.run": selected.run,
                    "memloop.transfer.cycle": str(selected.cycle),
                    "memloop.transfer.writer": row.writer,
                    "memloop.transfer.arm": arm,
                },
            )
    atomic_write_json(
        out / "transfer.json",
        {
            "run": selected.run,
            "cycle": selected.cycle,
            "rule": selected.rule if prompts_file is None else f"--prompts {prompts_file}",
            "objective": objective,
            "test_users": [item.id for item in items],
            "rows": [r.to_dict() for r in rows],
        },
        indent=1,
    )
    return rows


def transfer_table(rows: list[TransferRow], fmt: str = "table") -> str:
    """One row per writer: both arms' means, the paired difference and the gate's verdict."""
    from memloop.core.tables import format_table

    headers = ["writer", "seed", "selected", "n", "mean diff", "95% CI", "p (sign-flip)"]
    headers += ["up/tied/down", "gate"]
    body = [r.cells() for r in rows]
    return format_table(headers, body, align="l" + "r" * (len(headers) - 1), fmt=fmt)
