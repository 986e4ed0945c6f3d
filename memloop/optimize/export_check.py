"""`memloop export --check`: an exported artifact re-scored where it will run.

An export is tested to load; this measures whether it keeps its score once taken out of memloop
(an optimized prompt that lost its gain outside its optimizer is a reported problem, dspy
#8042). The artifact just written is run, in the runtime it is for, on the run's test users
(the same users, periods, rounds, probes and endpoints as the run; the cycle's own test scores
are memloop's score of the same prompts):

- text: a policy YAML whose ``prompts_from:`` names the file (the run's policy otherwise);
- dspy: ``dspy.load`` of the whole program; for AWI the loaded program writes every memory edit,
  for AWE mem0 sends the loaded program's prompts (AWE's program holds them; mem0 runs them);
- mem0: ``mem0.Memory.from_config`` of the exported config, with mem0's own OpenAI client at the
  run's agent endpoint, its own embedder and store; the assistant's replies and the probes go
  through memloop's client as in the run, so only the memory writes change runtime.

The gap is the per-user difference export - memloop of the run's objective: n, mean, t
interval, exact sign-flip p and users up / tied / down (`core.stats.Paired`), or "identical"
when every user's score is equal. The check is an eval run in MLflow (`log_eval`, through the
recorder; experiment `export-check`, tagged with the run and cycle it checks); its folder is
``<out name>.check/`` beside the export (an interrupted check resumes there), holding its record
``check.json``, which is also written into the export (`Exported.check`).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json, json_sha256
from memloop.core.stats import Paired
from memloop.environment.data import UserItem
from memloop.results.export import Exported, key_placeholder

CHECK_EXPERIMENT = "export-check"
CHECK_FILE = "check.json"  # the check's record, in its folder
CHECK_FILES = ("metrics.json", "records.jsonl", "episodes", CHECK_FILE)  # what the folder holds
RUNTIMES = {  # where each format's check runs it (the module doc says more)
    "text": "the run's policy with prompts_from: the file",
    "dspy": "dspy.load of the whole program",
    "mem0": "mem0's own Memory.from_config, LLM client and store",
}


@dataclass
class ExportCheck:
    """The paired comparison of one export's runtime with memloop's score of its prompts."""

    fmt: str
    objective: str
    memloop: dict[str, float]  # {test user: the run's own score of the cycle}
    exported: dict[str, float]  # {test user: the export's score where it runs}
    folder: Path
    run_name: str | None = None  # the check's MLflow run

    @functools.cached_property
    def paired(self) -> Paired:  # read by the summary, the record, MLflow's metrics and the CLI
        return Paired.of(self.exported, self.memloop)

    @property
    def identical(self) -> bool:
        return bool(self.memloop) and self.exported == self.memloop

    def summary(self) -> str:
        """One line: what ran where, both means, and the gap (or `identical`)."""
        paired = self.paired
        users = sorted(set(self.memloop) & set(self.exported))
        mean = (lambda d: sum(d[u] for u in users) / len(users)) if users else None
        if mean is None:
            return f"{self.fmt} ({RUNTIMES[self.fmt]}): no test user scored on both sides"
        gap = "identical on every user" if self.identical else f"gap {paired}"
        return (
            f"{self.fmt} ({RUNTIMES[self.fmt]}) on {len(users)} test users: per-user mean "
            f"{self.objective} memloop {mean(self.memloop):.3f}, export "
            f"{mean(self.exported):.3f}; {gap}"
        )

    def record(self) -> dict[str, Any]:
        """What the export records of its check."""
        return {
            "format": self.fmt,
            "runtime": RUNTIMES[self.fmt],
            "objective": self.objective,
            "users": len(set(self.memloop) & set(self.exported)),
            "identical": self.identical,
            "gap": self.paired.to_dict(),
            "memloop": self.memloop,
            "export": self.exported,
            "folder": str(self.folder),
            "mlflow_run": self.run_name,
            "summary": self.summary(),
        }


def check_folder(out: Path) -> Path:
    """Where the check of the export written to `out` runs: ``<name>.check/`` beside it."""
    return out.with_name(f"{out.name}.check")


def _run_folder(exported: Exported) -> Path:
    if exported.run_id is not None:
        raise UserError(
            f"--check: RUN {exported.run!r} is an MLflow run; the check re-runs its test users, "
            "whose ids are in its run folder: give the folder (runs/<experiment>/<condition>)"
        )
    return Path(exported.run)


def run_test_users(
    spec: Any, env: str | None, option: str = "--check", splits: tuple[str, ...] = ("test",)
) -> list[UserItem]:
    """The run's test users, from its environment (regenerated, or `env` with the same sha256).

    `option`: the command's word its one-line refusals start with; `splits`: the users of the
    first of these splits the run has (a run decided on confirmation users has no test users).
    """
    from memloop.optimize.config import EnvSpec
    from memloop.runs.inputs import load_environment

    described = spec.environment
    if "procedural" in described:
        from memloop.environment.procedural import ProceduralSpec, generate_procedural

        args = {k: v for k, v in described["procedural"].items() if k != "catalogue_sha256"}
        if ProceduralSpec(**args).describe() != described["procedural"]:
            raise UserError(
                f"{option}: the run's procedural environment comes out differently now (its "
                "catalogue changed since the run); its users cannot be rebuilt"
            )
        items = generate_procedural(**args)
    else:
        source = env or (described["path"] if "://" in described["path"] else None)
        if source is None:
            raise UserError(
                f"{option}: the run's users come from {described['path']} (sha256 "
                f"{described['sha256'][:12]}...); give that file: --env PATH"
            )
        items, now = load_environment(EnvSpec(path=source))
        if now["sha256"] != described["sha256"]:
            raise UserError(
                f"--env {source}: not the run's environment (its sha256 differs from the "
                f"{described['path']} the run used)"
            )
    wanted: list[str] = next((spec.users[s] for s in splits if spec.users.get(s)), [])
    if not wanted:
        raise UserError(
            f"{option}: the run has no {' or '.join(splits)} users; nothing to evaluate on"
        )
    by_id = {item.id: item for item in items}
    missing = [u for u in wanted if u not in by_id]
    if missing:
        raise UserError(f"{option}: the environment lacks the run's test user {missing[0]}")
    return [by_id[u] for u in wanted]


def run_endpoints(spec: Any, api_key_env: str | None) -> dict[str, Any]:
    """The run's endpoints, rebuilt from its identity (the key read from `api_key_env`)."""
    from urllib.parse import urlparse

    from memloop.core.credentials import DEFAULT_KEY_ENV, OPENAI_HOST
    from memloop.llm.endpoint import Endpoint

    letters = (spec.evaluation.get("probes") or {}).get("state_read") == "letters"
    out = {}
    for role, settings in spec.endpoints.items():
        endpoint = Endpoint.from_mapping(dict(settings), f"the run's {role} endpoint")
        if not endpoint.is_local:
            host = (urlparse(endpoint.base_url).hostname or "").lower()
            key_env = api_key_env or (DEFAULT_KEY_ENV if host == OPENAI_HOST else None)
            # the run read letters: its agent returned log-probabilities
            endpoint = endpoint.model_copy(
                update={"api_key_env": key_env, **({"logprobs": True} if letters else {})}
            )
        out[role] = endpoint
    return out


def _mem0_deployment(path: Path, api_key_env: str | None) -> dict[str, Any]:
    """The exported mem0 config as mem0 would load it, its key placeholder filled in memory."""
    config = json.loads(path.read_text(encoding="utf-8"))
    llm = config.get("llm", {}).get("config", {})
    if api_key_env and llm.get("api_key") == key_placeholder(api_key_env):
        value = os.environ.get(api_key_env)
        if not value:
            raise UserError(
                f"--check: the mem0 config's key is read from ${api_key_env}, which is not set"
            )
        llm["api_key"] = value  # in memory only: the file keeps its placeholder
    return config


def _factory(
    fmt: str,
    written: list[Path],
    policy: dict[str, Any],
    items: list[UserItem],
    *,
    tracking_uri: str,
    api_key_env: str | None,
):
    """(policy factory, prompts it writes with, its policy config) for the artifact's runtime."""
    from memloop.policies import build_policy, parse_policy_config
    from memloop.runs.inputs import load_policy

    base = {k: v for k, v in policy.items() if v is not None and k != "prompts"}
    if fmt == "text":
        import tempfile

        import yaml

        with tempfile.TemporaryDirectory(prefix="memloop-check-") as scratch:
            yaml_path = Path(scratch) / "policy.yaml"  # the file's path is absolute in it
            text = yaml.safe_dump({**base, "prompts_from": str(written[0].resolve())})
            yaml_path.write_text(text, encoding="utf-8")
            config = load_policy(yaml_path, tracking_uri, items)
        prompts = dict(config.prompts or {})
        return (lambda uid, workdir, client: build_policy(config, client, workdir)), prompts, config
    config = parse_policy_config(base, "the run's policy (spec.json)")
    if fmt == "dspy":
        import dspy

        from memloop.core.settings import quiet_logger
        from memloop.policies.programs import program_prompts

        whole = written[1]

        def load() -> Any:
            with quiet_logger("dspy.primitives.base_module"):  # its "untrusted .pkl" warning
                return dspy.load(str(whole), allow_pickle=True)

        prompts = program_prompts(load())

        def make_dspy(uid: str, workdir: Path, client: Any) -> Any:
            policy = build_policy(config, client, workdir, prompts=prompts)
            policy.adopt_program(load())  # the loaded object itself writes (or holds mem0's)
            return policy

        return make_dspy, prompts, config
    from memloop.policies.external import AWEPolicy
    from memloop.policies.prompt_files import parse_mem0

    deployment = _mem0_deployment(written[0], api_key_env)
    prompts = parse_mem0(deployment, str(written[0]))  # as prompts_from: reads a mem0 config
    return (
        (lambda uid, workdir, client: AWEPolicy.deployed(config, client, workdir, deployment)),
        prompts,
        config,
    )


@dataclass
class CheckInputs:
    """What a check needs from the run, gathered (and refused) before the export is written."""

    exported: Exported
    spec: Any  # the run's RunSpec
    objective: str
    ours: dict[str, float]  # the run's per-user test scores of the cycle
    items: list[UserItem]  # its test users
    clients: Any  # RoleClients at the run's endpoints
    api_key_env: str | None


def prepare_check(
    exported: Exported,
    *,
    env: str | None = None,
    api_key_env: str | None = None,
    cache: Any = "default",
) -> CheckInputs:
    """The run's test users, scores and endpoints for checking `exported`; one line if missing.

    Called before the export is written, so a check that cannot run leaves nothing behind.
    """
    from memloop.feedback.objective import LEGACY_OBJECTIVE
    from memloop.runs.cycles import per_user_values
    from memloop.runs.folder import read_spec
    from memloop.runs.inputs import roles
    from memloop.runs.store import CycleStore

    folder = _run_folder(exported)
    spec = read_spec(folder, option="RUN")
    assert spec is not None  # export read this folder's spec already
    objective = spec.objective or LEGACY_OBJECTIVE
    record = CycleStore(folder).record(exported.cycle)
    test = None if record is None else record.splits.get("test")
    if test is None:
        raise UserError(
            f"--check: cycle {exported.cycle} of {folder} has no test users' scores to pair with"
        )
    items = run_test_users(spec, env)
    endpoints = run_endpoints(spec, api_key_env)
    clients = roles(
        endpoints["agent"],
        endpoints.get("user_sim"),
        endpoints.get("checker"),
        endpoints.get("optimizer"),
        cache=cache,
    )
    clients.preflight()  # an unreachable server or a missing key: one line, before any work
    return CheckInputs(
        exported=exported,
        spec=spec,
        objective=objective,
        ours=per_user_values(test.per_user, objective),
        items=items,
        clients=clients,
        api_key_env=api_key_env,
    )


def evaluate_as_run(
    spec: Any,
    items: list[UserItem],
    clients: Any,
    config: Any,
    prompts: dict[str, str],
    factory: Any,
    folder: Path,
    *,
    source: str,
    command: str,
    label: str,
    progress: bool,
    run_files: tuple[str, ...] = (),
    force: bool = False,
) -> tuple[Any, Any]:
    """(the evaluation, its eval spec) of `factory`'s policy on `items`, as the run evaluated.

    The run `spec`'s environment, periods, rounds and probes, at `clients`; in the eval run
    folder `folder` (a killed one resumes); `source` names where `prompts` came from. The one
    way the export check and `memloop transfer` re-score a run's users.
    """
    from memloop.environment.simulator import SimulatorConfig
    from memloop.feedback.evaluate import EvaluationSettings, run_evaluation
    from memloop.feedback.probes import ProbeSettings
    from memloop.runs.folder import open_run_folder
    from memloop.runs.spec import eval_spec

    evaluation = spec.evaluation
    probes = ProbeSettings(**(evaluation.get("probes") or {}))
    run_spec = eval_spec(
        environment=spec.environment,
        user_ids=[item.id for item in items],
        policy=config.model_dump(mode="json"),
        prompts_sha256=json_sha256(prompts),
        prompts_source=source,
        endpoints=clients.identity(),
        periods=evaluation.get("periods"),
        rounds=evaluation["rounds"],
        replay=None,
        record_only=False,
        probes=probes.spec(),
    )
    rounds = evaluation["rounds"]
    with open_run_folder(folder, run_spec, command, run_files=run_files, force=force):
        result = run_evaluation(
            items,
            factory,
            folder,
            clients=clients,
            label=label,
            group="test",
            settings=EvaluationSettings(
                sim_config=SimulatorConfig(
                    rounds_init=rounds["init"], rounds_update=rounds["update"]
                ),
                periods=evaluation.get("periods"),
                progress=progress,
                plot=False,
                probes=probes,
            ),
        )
    return result, run_spec


def check_export(
    inputs: CheckInputs,
    fmt: str,
    written: list[Path],
    *,
    tracking_uri: str,
    progress: bool = True,
) -> ExportCheck:
    """Score the export `written` in its runtime on the run's test users, paired with the run."""
    from memloop.runs.cycles import per_user_values
    from memloop.runs.eval_log import log_eval

    exported, spec, objective = inputs.exported, inputs.spec, inputs.objective
    items, clients, ours = inputs.items, inputs.clients, inputs.ours
    check_dir = check_folder(written[0])
    factory, prompts, config = _factory(
        fmt,
        written,
        spec.policy,
        items,
        tracking_uri=tracking_uri,
        api_key_env=inputs.api_key_env,
    )
    # a check of another artifact starts over in the folder; a killed one resumes
    result, check_spec = evaluate_as_run(
        spec,
        items,
        clients,
        config,
        prompts,
        factory,
        check_dir,
        source=f"export-{fmt}:{written[0].name}",
        command="memloop export --check",
        label=f"export check ({fmt})",
        progress=progress,
        run_files=CHECK_FILES,
        force=True,
    )
    check = ExportCheck(
        fmt=fmt,
        objective=objective,
        memloop=ours,
        exported=per_user_values(result.metrics.get("per_user", {}), objective),
        folder=check_dir,
    )
    paired = check.paired
    gap = {
        "export_check/gap": paired.mean,
        "export_check/gap_lo": paired.t95[0] if paired.t95 else None,
        "export_check/gap_hi": paired.t95[1] if paired.t95 else None,
        "export_check/sign_flip_p": paired.sign_flip_p,
    }
    _, check.run_name = log_eval(
        tracking_uri,
        CHECK_EXPERIMENT,
        check_spec,
        policy=config.display_name,
        objective=objective,
        prompts=prompts,
        result=result,
        out=check_dir,
        tags={
            "memloop.export_check.run": exported.run,
            "memloop.export_check.cycle": str(exported.cycle),
            "memloop.export_check.format": fmt,
            "memloop.export_check.identical": str(check.identical).lower(),
        },
        more_metrics=gap,
    )
    atomic_write_json(check_dir / CHECK_FILE, check.record(), indent=1)
    return check
