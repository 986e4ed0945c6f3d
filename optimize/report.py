"""Printed summaries of evolution outcomes."""

from __future__ import annotations

from typing import Any


def _f(v: Any) -> str:
    return "  n/a" if v is None else f"{v:5.3f}"


def print_outcomes(config: Any, outcomes: list[Any]) -> None:
    print(f"\nexperiment {config.experiment_name} (MLflow: {config.tracking_uri})")
    print("feedback       evolver     cycle  mem_score  overall  recall  write  read   util")
    for o in outcomes:
        for c in o.cycles:
            print(f"{o.mode:<14} {o.evolver:<11} {c['cycle']:>5}  {_f(c.get('memory_score'))}"
                  f"      {_f(c.get('overall'))}    {_f(c.get('factual_recall'))}   "
                  f"{_f(c.get('write'))}  {_f(c.get('read'))}  {_f(c.get('utilization'))}")
    print("run folders: " + ", ".join(str(o.run_dir) for o in outcomes))
