"""`memloop export`: an evolve run's prompts in the forms people deploy.

The run is a run folder (``runs/<experiment>/<condition>``, the one evolve wrote) or an MLflow
run (name or id) read through MLflow's client, so a tracking server works like a local store.
The cycle is the one selected on validation users (compare's rule, `select_cycle`) unless
``--cycle`` names another.

Formats:
- ``text``: each prompt under a ``=== name ===`` line, after ``#`` lines saying where it came from;
- ``mem0``: a JSON config mem0's own ``MemoryConfig`` accepts, with
  ``custom_fact_extraction_prompt`` and ``custom_update_memory_prompt`` (AWE runs only); merge
  your llm/embedder/vector_store into it;
- ``dspy``: the policy's DSPy program (``AWIProgram``/``AWEProgram``) saved with DSPy's ``save``;
  ``program.load(path)`` restores it.

Every format but dspy's (whose file DSPy's ``load`` reads whole) records the run, cycle, rule,
validation score and commit; dspy's program is written beside a ``.source.json`` that does.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json, atomic_write_text
from memloop.feedback.objective import LEGACY_OBJECTIVE
from memloop.optimize.cycles import CycleRecord, select_cycle
from memloop.policies.prompt_files import MEM0_KEYS
from memloop.policies.prompt_files import render_text as render_prompt_text

FORMATS = ("text", "mem0", "dspy")


@dataclass
class Exported:
    """The prompts of one cycle of one run, and where they came from."""

    run: str  # the run folder or MLflow run name, as the user named it
    run_id: str | None  # the MLflow run id (None for a folder)
    policy: str  # the policy type (awi, awe, ...)
    cycle: int
    rule: str  # why this cycle: "best val_<objective>", "last cycle ...", "--cycle N"
    objective: str | None
    val_objective: float | None
    test_objective: float | None
    commit: str | None
    prompts: dict[str, str]

    def source(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("prompts")
        return out


def _pick(records: list[CycleRecord], objective: str | None, cycle: int | None, run: str):
    if not records:
        raise UserError(f"{run}: the run has no finished cycle yet; nothing to export")
    if cycle is not None:
        known = [r.cycle for r in records]
        if cycle not in known:
            raise UserError(f"--cycle {cycle}: {run} has finished cycles {known[0]}-{known[-1]}")
        return cycle, f"--cycle {cycle}"
    selection = select_cycle(records, objective or LEGACY_OBJECTIVE)
    assert selection is not None  # records is not empty
    return selection.cycle, selection.rule


def _scores(record: CycleRecord, objective: str | None) -> tuple[float | None, float | None]:
    metric = objective or LEGACY_OBJECTIVE
    return record.score("val", metric), record.score("test", metric)


def from_folder(folder: Path, cycle: int | None) -> Exported:
    from memloop.optimize.store import CycleStore
    from memloop.runs.folder import SPEC_FILE, read_spec

    spec = read_spec(folder, option="RUN")
    if spec is None:
        raise UserError(f"{folder}: no {SPEC_FILE}; not an evolve run folder")
    if spec.kind != "evolve":
        raise UserError(f"{folder}: a {spec.kind} run; export reads evolve runs")
    store = CycleStore(folder)
    records: list[CycleRecord] = []
    while (record := store.record(len(records))) is not None:
        records.append(record)
    k, rule = _pick(records, spec.objective, cycle, str(folder))
    prompts = store.saved_prompts(k)
    if prompts is None:
        raise UserError(f"{folder}: cycle {k} recorded no prompts")
    val, test = _scores(records[k], spec.objective)
    document = json.loads((folder / SPEC_FILE).read_text())
    return Exported(
        run=str(folder),
        run_id=None,
        policy=str(spec.policy.get("type")),
        cycle=k,
        rule=rule,
        objective=spec.objective,
        val_objective=val,
        test_objective=test,
        commit=document.get("git_revision"),
        prompts=prompts,
    )


def _find_run(mlc, name: str, tracking_uri: str):
    """The MLflow run with id or name `name`, over every experiment; one line when not one."""
    from mlflow.exceptions import MlflowException

    if re.fullmatch(r"[0-9a-f]{32}", name):
        try:
            return mlc.get_run(name)
        except MlflowException:
            pass
    experiments = [e.experiment_id for e in mlc.search_experiments()]
    quoted = name.replace("'", "\\'")
    runs = mlc.search_runs(experiments, f"attributes.run_name = '{quoted}'") if experiments else []
    runs = [r for r in runs if r.data.tags.get("memloop.kind") == "evolve"]
    if not runs:
        raise UserError(
            f"RUN {name!r}: no run folder or evolve run of that name or id in {tracking_uri}"
        )
    if len(runs) > 1:
        ids = ", ".join(r.info.run_id for r in runs[:5])
        raise UserError(f"RUN {name!r}: {len(runs)} evolve runs have that name ({ids}); give an id")
    return runs[0]


def from_mlflow(name: str, tracking_uri: str, cycle: int | None) -> Exported:
    from memloop.optimize.compare import logged_prompts, run_records
    from memloop.runs import tracker
    from memloop.runs.spec import spec_from_params

    mlc = tracker.client(tracking_uri, create=False)
    with tracker.store_errors(tracking_uri):
        run = _find_run(mlc, name, tracking_uri)
        records = run_records(mlc, run.info.run_id)
        objective = run.data.tags.get("memloop.objective")
        k, rule = _pick(records, objective, cycle, name)
        prompts = logged_prompts(mlc, run.info.run_id, k)
    val, test = _scores(records[k], objective)
    return Exported(
        run=name,
        run_id=run.info.run_id,
        policy=str(spec_from_params(run.data.params).get("policy.type")),
        cycle=k,
        rule=rule,
        objective=objective,
        val_objective=val,
        test_objective=test,
        commit=run.data.tags.get("mlflow.source.git.commit"),
        prompts=prompts,
    )


def load_exported(run: str, tracking_uri: str, cycle: int | None = None) -> Exported:
    folder = Path(run)
    if folder.is_dir():
        return from_folder(folder, cycle)
    return from_mlflow(run, tracking_uri, cycle)


def _header(exported: Exported) -> list[str]:
    def num(x: float | None) -> str:
        return "undefined" if x is None else f"{x:.3f}"

    metric = exported.objective or LEGACY_OBJECTIVE
    return [
        f"# memloop export of run {exported.run}"
        + (f" (MLflow run {exported.run_id})" if exported.run_id else ""),
        f"# policy {exported.policy}, cycle {exported.cycle} ({exported.rule})",
        f"# {metric}: validation {num(exported.val_objective)}, "
        f"test {num(exported.test_objective)}",
        f"# commit {exported.commit or 'unknown'}",
    ]


def render_text(exported: Exported) -> str:
    return render_prompt_text(exported.prompts, _header(exported))


def mem0_config(exported: Exported) -> dict[str, Any]:
    """A MemoryConfig-shaped mapping: the two custom prompts and the source (mem0 ignores it)."""
    missing = [name for name in MEM0_KEYS if name not in exported.prompts]
    if missing:
        raise UserError(
            f"--format mem0: run {exported.run}'s policy {exported.policy!r} has prompts "
            f"({', '.join(exported.prompts) or 'none'}), not mem0's; use --format text or dspy"
        )
    out: dict[str, Any] = {"version": "v1.1"}
    for name, key in MEM0_KEYS.items():
        out[key] = exported.prompts[name]
    out["memloop_source"] = exported.source()
    return out


def dspy_program(exported: Exported):
    from memloop.policies.programs import AWEProgram, AWIProgram

    programs = {"awi": AWIProgram, "awe": AWEProgram}
    cls = programs.get(exported.policy)
    names = {"awi": {"writer"}, "awe": set(MEM0_KEYS)}.get(exported.policy)
    if cls is None or names != set(exported.prompts):
        raise UserError(
            f"--format dspy: run {exported.run}'s policy {exported.policy!r} has no DSPy program "
            f"in memloop (programs: {', '.join(programs)}); use --format text"
        )
    return cls(**exported.prompts)


def write_export(exported: Exported, fmt: str, out: Path) -> list[Path]:
    """Write `exported` as `fmt` to `out`; the files written."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: one of {', '.join(FORMATS)}")
    if out.is_dir():
        raise UserError(f"--out {out}: is a folder; give a file name")
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "text":
        atomic_write_text(out, render_text(exported))
        return [out]
    if fmt == "mem0":
        atomic_write_json(out, mem0_config(exported), indent=2)
        return [out]
    from memloop.policies.programs import save_program

    if out.suffix != ".json":
        raise UserError(f"--out {out}: DSPy saves a program's state as .json; name a .json file")
    save_program(dspy_program(exported), out)
    source = out.with_name(f"{out.stem}.source.json")
    atomic_write_json(source, exported.source(), indent=2)
    return [out, source]
