"""``check_search``: the conformance suite of the Search contract, beside check_evolver.

A :class:`memloop.optimize.contract.Search` turns a run into cycles. The suite runs it on a tiny
procedural environment (4 users: 2 train, 1 val, 1 test; 2 periods) in a folder of its own, with
the clients it is given, and checks its promises: every member of the contract is present and its
settings are a `Settings` that builds from defaults; `cycles` yields `CycleRecord`s numbered
0, 1, ... in order, each saved in the run's store before it is yielded, each with the val and
test splits evaluated; and a second search from the same factory, resuming in the same folder,
yields the same records (nothing finished is redone or changed).

It iterates `search.cycles(ctx)` itself: no MLflow run is opened and nothing is selected.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memloop.core.checks import CheckReport, ContractError
from memloop.llm.roles import RoleClients
from memloop.optimize.contract import SEARCH_MEMBERS, check_declaration
from memloop.runs.cycles import CycleRecord


class SearchCheckError(ContractError):
    """One or more promises of the Search contract are broken; the message lists them."""


def check_config(workdir: Path, evolver: str, cycles: int) -> Any:
    """The tiny evolve config the suite runs a search on."""
    from memloop.optimize.config import EvolveConfig

    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "policy.yaml"
    policy.write_text("type: awi\n")
    return EvolveConfig(
        experiment="check-search",
        environment={
            "procedural": {"users": 4, "periods": 2, "questions": 2, "seed": 3},
            "train_users": 2,
            "val_users": 1,
            "test_users": 1,
        },
        policy=str(policy),
        feedback_modes=["complete"],
        evolvers=[evolver],
        cycles=cycles,
        out_dir=str(workdir / "runs"),
        tracking_uri=f"sqlite:///{workdir}/mlruns/mlflow.db",
    )


def check_search(
    search_factory: Callable[[], Any],
    *,
    clients: RoleClients,
    workdir: Path | str,
    evolver: str = "reflective",
    cycles: int = 2,
    builder: Any = None,
    raise_on_problem: bool = True,
) -> CheckReport:
    """Check the searches ``search_factory()`` builds, on ``clients`` in ``workdir``.

    ``evolver`` proposes for a search that does not evolve the prompts itself; ``builder``
    replaces policies.build_policy (memloop.testing.scripted_builder: model-free memory).

    Raises:
        SearchCheckError: listing every problem, unless ``raise_on_problem`` is False.
    """
    from memloop.optimize.context import RunContext

    first = search_factory()
    report = CheckReport(name=str(getattr(first, "name", type(first).__name__)))
    expect = report.expect

    if not check_declaration(report, first, SEARCH_MEMBERS, "Search"):
        return _finish(report, raise_on_problem)
    expect(
        isinstance(first.needs_val, bool) and isinstance(first.evolves_itself, bool),
        "needs_val and evolves_itself are bools",
        f"needs_val {first.needs_val!r}, evolves_itself {first.evolves_itself!r}",
    )
    workdir = Path(workdir)
    config = check_config(workdir, evolver, cycles)
    name = first.name if first.evolves_itself else evolver

    def run(search: Any) -> tuple[list[CycleRecord], list[str]]:
        ctx = RunContext(
            config, "complete", name, search, clients=clients, builder=builder, progress=False
        )
        records, unsaved = [], []
        for record in search.cycles(ctx):
            saved = ctx.store.record(record.cycle) if isinstance(record, CycleRecord) else None
            if saved is None or saved.model_dump() != record.model_dump():
                unsaved.append(str(getattr(record, "cycle", record)))
            records.append(copy.deepcopy(record))
        return records, unsaved

    records, unsaved = run(first)
    if not expect(
        bool(records) and all(isinstance(r, CycleRecord) for r in records),
        "cycles() yields CycleRecords",
        f"cycles() yielded {[type(r).__name__ for r in records] or 'nothing'}",
    ):
        return _finish(report, raise_on_problem)
    numbers = [r.cycle for r in records]
    expect(
        numbers == list(range(len(records))),
        "the cycles are numbered 0, 1, ... in order",
        f"cycles yielded in the order {numbers}",
    )
    expect(
        not unsaved,
        "each cycle is saved in the run's store before it is yielded",
        f"cycles not saved (or saved otherwise) when yielded: {', '.join(unsaved)}",
    )
    partial = [r.cycle for r in records if not {"val", "test"} <= set(r.splits)]
    expect(
        not partial,
        "each cycle evaluates the val and test users",
        f"cycles without val or test results: {partial}",
    )
    again, _ = run(search_factory())
    expect(
        [r.model_dump() for r in again] == [r.model_dump() for r in records],
        "a resumed search yields the same cycles (nothing finished redone or changed)",
        f"resuming in the same folder gave {len(again)} cycles that differ from the "
        f"{len(records)} of the first run",
    )
    return _finish(report, raise_on_problem)


def _finish(report: CheckReport, raise_on_problem: bool) -> CheckReport:
    return report.finish(SearchCheckError, "Search", raise_on_problem)
