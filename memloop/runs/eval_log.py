"""`memloop eval` in MLflow: one run per eval, in the layout `memloop compare` reads.

The eval's users are its test users (only evaluated, nothing chosen on them): the run holds one
cycle, cycle 0, whose record (`cycle/cycle_00.json`) has a `test` split; its prompts are
`prompts/cycle_00.json`; its metrics are `test/*` at step 0 (and `Objective/test_<objective>`),
its numbers `headline.test_*` params; each user's sessions are traces. Two evals on the same
environment, users, endpoints and periods share `memloop.like` whatever their policy or
prompts, so `compare` pairs them user by user (`--baseline NAME`, else the first eval).
The source of `prompts_from:` is kept as tags: the reference, and for a registry version or an
exported file, the run, cycle and version it came from.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from memloop.feedback.evaluate import EvaluationResult
from memloop.feedback.metrics import cycle_metrics
from memloop.runs import tracker
from memloop.runs.cycles import CycleRecord, headline_values, objective_curves
from memloop.runs.inputs import prompt_file
from memloop.runs.recorder import recording
from memloop.runs.spec import RunSpec
from memloop.runs.traces import episode_traces

EVAL_MODE = "eval"
"""An eval run's `memloop.feedback_mode` (its `memloop.evolver` is the run's name)."""


def eval_run_name(policy: str, spec: RunSpec) -> str:
    """`eval-<policy>-<source>-<key>`: one name per eval, saying which prompts ran.

    What `compare --baseline` takes; `<source>` is `source_label`'s.
    """
    source = spec.prompts_source or "seed"
    return f"eval-{policy}-{source}-{spec.key()[:8]}"


SOURCE_TAG = "memloop.prompts_source"


def source_label(policy_yaml: str | Path, source_tags: dict[str, str]) -> str:
    """Where a policy YAML's prompts come from, in a run's name.

    `seed` (the policy's own), `inline` (its `prompts:`), the file `prompts_from:` names, or
    the registry version it names, resolved (`NAME/VERSION`; `source_tags` are `prompts_source`'s).
    """
    from memloop.core.config import load_yaml_mapping

    if "memloop.prompts_from.version" in source_tags:
        return source_tags["memloop.prompts_from.version"]
    if "memloop.prompts_from" in source_tags:
        return Path(source_tags["memloop.prompts_from"]).name
    return "inline" if "prompts" in load_yaml_mapping(Path(policy_yaml)) else "seed"


def log_eval(
    tracking_uri: str,
    experiment: str,
    spec: RunSpec,
    *,
    policy: str,
    objective: str,
    prompts: dict[str, str],
    result: EvaluationResult,
    out: Path,
    tags: dict[str, str] | None = None,
    more_metrics: dict[str, float | None] | None = None,
) -> tuple[str, str]:
    """Log a finished eval; (run id, run name). A rerun of the same eval continues its run.

    `more_metrics`: logged at step 0 beside the eval's own (an export check's gap).
    """
    name = eval_run_name(policy, spec)
    run_tags = {
        "memloop.feedback_mode": EVAL_MODE,
        "memloop.evolver": name,
        "memloop.search": EVAL_MODE,
        "memloop.policy": policy,
        "memloop.objective": objective,
        **(tags or {}),
    }
    with recording(tracking_uri, experiment, spec, name, tags=run_tags) as rec:
        record = CycleRecord.of(0, {"test": result})
        curves = objective_curves(record, objective)
        rec.metrics({**curves, **record.metrics(), **(more_metrics or {})}, step=0)
        rec.text(record.model_dump_json(indent=1), "cycle/cycle_00.json")
        rec.text(_json(prompts), "prompts/cycle_00.json")
        params = headline_values({m: record.score("test", m) for m in (*cycle_metrics(), "users")})
        rec.params(params)
        users = {u: "test" for u in record.splits["test"].per_user}
        episodes = out / "episodes"
        if episodes.is_dir():
            rec.traces(episode_traces(episodes, run_label=name, splits=users))
        rec.tags(
            {
                tracker.DESCRIPTION_TAG: (
                    f"**{name}**: `memloop eval` of {policy} with the prompts of "
                    f"`{spec.prompts_source or 'seed'}` on {params['headline.test_users']} "
                    f"users; {objective} {params[f'headline.test_{objective}']}. Traces: each "
                    "user's sessions (Traces tab)."
                )
            }
        )
    return rec.run_id, name


def _json(value: Any) -> str:
    import json

    return json.dumps(value, indent=1, sort_keys=True)


_EXPORT_RUN = re.compile(r"^# memloop export of run (\S+)")
_EXPORT_CYCLE = re.compile(r"^# policy .*, cycle (\d+) ")


def prompts_source(policy_yaml: str | Path, tracking_uri: str) -> dict[str, str]:
    """Tags naming where a policy YAML's `prompts_from:` prompts came from (none without one).

    `memloop.prompts_from`: the reference as written; for a registry version
    `memloop.prompts_from.run` / `.cycle` / `.version` (the version's own tags), for a file
    `memloop export` wrote, the run and cycle its header names.
    """
    from memloop.core.config import load_yaml_mapping

    source = load_yaml_mapping(Path(policy_yaml)).get("prompts_from")
    if not isinstance(source, str):
        return {}
    tags = {"memloop.prompts_from": source}
    if source.startswith("prompts:"):
        tags.update(tracker.registered_source(tracking_uri, source))
        return tags
    path = prompt_file(source, Path(policy_yaml))
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines()[:12]:
            if m := _EXPORT_RUN.match(line):
                tags["memloop.prompts_from.run"] = m.group(1)
            elif m := _EXPORT_CYCLE.match(line):
                tags["memloop.prompts_from.cycle"] = m.group(1)
    return tags
