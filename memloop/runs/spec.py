"""`RunSpec`: the one place a run's identity is computed.

A frozen record of everything that decides a run's numbers: its kind, experiment, environment,
users per split, policy settings and the sha256 of the prompts it starts from, the settings of
each role's endpoint that change results (model, base URL, temperature, max tokens, context
window: not concurrency, timeouts or retries), evaluation settings, feedback mode, objective,
optimizer name and settings, seed, repeat, scorer and catalogue versions. From it come the run
key (which decides resume-or-refuse), the MLflow params and tags, and spec.json. `like` is the
part two runs must share for compare to pair them: everything but what the optimizer chooses
(mode, objective, optimizer, seed, repeat).

spec.json also records the code revision and package versions (inspect_ai style): never part of
the key, so an upgrade resumes a run, and never a secret.
"""

from __future__ import annotations

import functools
import json
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memloop.core.files import json_sha256

PACKAGES = ("memloop", "dspy", "mem0ai", "optuna", "mlflow", "openai", "xllamacpp", "gepa")
RunKind = Literal["evolve", "tune", "tune_trial", "eval", "import"]
PARAM_PREFIX = "spec."
KEY_TAG = "memloop.run_key"
LIKE_TAG = "memloop.like"
LONG_PARAM = 400  # a longer value is logged as its sha256 (MLflow cuts params at 6000)
# what the optimizer chooses: left out of `like` (runs differing only here are paired)
CHOSEN = ("mode", "objective", "optimizer", "seed", "repeat")
# what two evals differ in when compared (the same users, endpoints and periods otherwise)
EVAL_COMPARED = ("policy", "prompts_sha256", "prompts_source")


def _git(*argv: str) -> str | None:
    """`git argv` in the memloop checkout this runs from: its output, None when it fails."""
    try:
        out = subprocess.run(
            ["git", *argv],
            capture_output=True,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


@functools.cache
def git_revision() -> str | None:
    """The commit of the memloop checkout this runs from (None when it is no checkout)."""
    out = _git("rev-parse", "HEAD")
    return (out or "").strip() or None


@functools.cache
def git_dirty() -> bool | None:
    """Whether that checkout has uncommitted changes to tracked files (None: no checkout)."""
    out = _git("status", "--porcelain", "--untracked-files=no")
    return None if out is None else bool(out.strip())


def versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _scorer_version() -> str:
    from memloop.feedback.records import SCORER_VERSION

    return SCORER_VERSION


def _catalogue_sha256() -> str:
    from memloop.environment.catalogue import catalogue_sha256

    return catalogue_sha256()


class RunSpec(BaseModel):
    """What a run is. Equal specs are the same run; `key()` is its hash."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: RunKind
    experiment: str | None = None
    environment: dict[str, Any] = Field(description="data file path and sha256, or procedural")
    users: dict[str, list[str]] = Field(description="user ids per split, in order")
    policy: dict[str, Any] = Field(description="the policy config")
    prompts_sha256: str | None = Field(None, description="the write prompts the run starts from")
    prompts_source: str | None = Field(
        None, description="where an eval's prompts came from: seed, inline, a file, a registry"
    )
    endpoints: dict[str, dict[str, Any]] = Field(description="role -> result-changing settings")
    evaluation: dict[str, Any] = Field(
        default_factory=dict, description="rounds, periods, summary budget, replay source, ..."
    )
    mode: str | None = None
    objective: str | None = None
    optimizer: dict[str, Any] | None = Field(None, description="name and settings")
    seed: int | None = None
    repeat: int = 0
    scorer_version: str = Field(default_factory=_scorer_version)
    catalogue_sha256: str = Field(default_factory=_catalogue_sha256)

    # -- identity ------------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """The spec as JSON; an unset `prompts_source` is left out (the keys runs had before)."""
        return self.model_dump(
            mode="json", exclude={"prompts_source"} if self.prompts_source is None else None
        )

    def key(self) -> str:
        return json_sha256(self.identity())

    def like(self) -> dict[str, Any]:
        """What a run shares with every run compare may pair it with.

        An eval's policy and prompts are what two evals compare: they are left out too.
        """
        left_out = (*CHOSEN, *EVAL_COMPARED) if self.kind == "eval" else CHOSEN
        return {k: v for k, v in self.identity().items() if k not in left_out}

    def like_key(self) -> str:
        return json_sha256(self.like())[:16]

    def differences(self, other: RunSpec) -> list[str]:
        """What differs, for a "changed: ..." line: a field, or up to 3 of its keys."""
        return differences(self.identity(), other.identity())

    # -- MLflow --------------------------------------------------------------------------------

    def params(self) -> dict[str, str]:
        """Flat MLflow params `spec.<field>[.<sub>...]`: texts, else JSON; long ones as a sha256.

        An unset value (None) is no param: MLflow's table shows it empty, not as "null".
        """
        out: dict[str, str] = {}

        def add(prefix: str, value: Any) -> None:
            if value is None:
                return
            if isinstance(value, dict) and value:
                for k, v in value.items():
                    add(f"{prefix}.{k}", v)
                return
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            out[prefix] = f"sha256:{json_sha256(value)}" if len(text) > LONG_PARAM else text

        for name, value in self.identity().items():
            add(f"{PARAM_PREFIX}{name}", value)
        out[f"{PARAM_PREFIX}key"] = self.key()
        return out

    def tags(self) -> dict[str, str]:
        tags = {
            KEY_TAG: self.key(),
            LIKE_TAG: self.like_key(),
            "memloop.kind": self.kind,
            "memloop.repeat": str(self.repeat),
        }
        if self.mode is not None:
            tags["memloop.feedback_mode"] = self.mode
        if self.objective is not None:
            tags["memloop.objective"] = self.objective
        if self.optimizer is not None and self.optimizer.get("name") is not None:
            tags["memloop.optimizer"] = str(self.optimizer["name"])
        return tags

    # -- spec.json -----------------------------------------------------------------------------

    def document(self) -> dict[str, Any]:
        """spec.json: the spec, its key, and (never in the key) code revision and versions."""
        return {
            "memloop_run_spec": 1,
            "key": self.key(),
            "spec": self.identity(),
            "git_revision": git_revision(),
            "versions": versions(),
        }

    @classmethod
    def from_document(cls, data: Any) -> RunSpec | None:
        """The spec of a spec.json memloop wrote; None for anything else."""
        if not isinstance(data, dict) or data.get("memloop_run_spec") != 1:
            return None
        try:
            return cls.model_validate(data.get("spec"))
        except ValueError:
            return None


def differences(mine: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """The keys whose values differ; a mapping differing in 1 to 3 keys is named by those."""
    out = []
    for k in dict.fromkeys([*mine, *theirs]):
        a, b = mine.get(k), theirs.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict) and k != "users":
            inner = [s for s in dict.fromkeys([*a, *b]) if a.get(s) != b.get(s)]
            if len(inner) <= 3:
                out += [f"{k}.{s}" for s in inner]
                continue
        out.append(k)
    return out


def spec_from_params(params: dict[str, str]) -> dict[str, str]:
    """The `spec.*` params of an MLflow run (compare's view of a RunSpec)."""
    return {k[len(PARAM_PREFIX) :]: v for k, v in params.items() if k.startswith(PARAM_PREFIX)}


def eval_spec(
    *,
    environment: dict[str, Any],
    user_ids: list[str],
    policy: dict[str, Any],
    prompts_sha256: str,
    prompts_source: str,
    endpoints: dict[str, dict[str, Any]],
    periods: int | None,
    rounds: dict[str, int],
    replay: str | None,
    record_only: bool,
    probes: dict[str, Any] | None,
) -> RunSpec:
    """`memloop eval`'s run: what changes its records (`probes` only when not the default).

    `prompts_source` (`eval_log.source_label`) too: the same text from two sources is two runs,
    each named after its source.
    """
    return RunSpec(
        kind="eval",
        environment=environment,
        users={"eval": user_ids},
        policy=policy,
        # the prompts it starts from: an edited default prompt is another run
        prompts_sha256=prompts_sha256,
        prompts_source=prompts_source,
        endpoints=endpoints,
        evaluation={
            "periods": periods,
            "rounds": rounds,
            "replay": replay,
            "record_only": record_only,
            **({"probes": probes} if probes else {}),
        },
    )


def import_spec(metrics: dict[str, Any], experiment: str) -> RunSpec:
    """An import's run: its source folders and what it holds (the same content, one run)."""
    source = metrics["imported_from"]
    return RunSpec(
        kind="import",
        experiment=experiment,
        environment={"amemgym_run": source["run_dir"], "format": source["format"]},
        users={"imported": sorted(metrics["per_user"])},
        policy={"upper_bound_dir": source["upper_bound_dir"], "diagnosis": source["diagnosis"]},
        endpoints={},
        evaluation={
            "periods": metrics["periods"],
            "content_sha256": json_sha256(metrics),
        },
        scorer_version=metrics["scorer_version"],
    )
