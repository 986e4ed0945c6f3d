"""`made_export`: the `Exported` of a made-up evolve run, for tests of the export formats."""

from __future__ import annotations

from typing import Any


def made_export(policy: str = "awe", *, base_url: str = "http://127.0.0.1:9/v1", **fields: Any):
    """An `Exported` of a run that exists nowhere (no folder, no MLflow run).

    `policy`'s seed prompts (AWE's two, AWI's writer), its config `{"type": policy}`, an agent
    model "m" at `base_url`, run "r" at cycle 0 with no scores and no commit; `fields` replace
    any of these (e.g. prompts, cycle, agent).
    """
    from memloop.policies.programs import (
        AWE_FACT_EXTRACTION_INSTRUCTIONS,
        AWE_MEMORY_UPDATE_INSTRUCTIONS,
        AWI_WRITER_INSTRUCTIONS,
    )
    from memloop.results.export import Exported

    seeds = {
        "awe": {
            "fact_extraction": AWE_FACT_EXTRACTION_INSTRUCTIONS,
            "memory_update": AWE_MEMORY_UPDATE_INSTRUCTIONS,
        },
        "awi": {"writer": AWI_WRITER_INSTRUCTIONS},
    }
    values: dict[str, Any] = {
        "run": "r",
        "run_id": None,
        "policy": policy,
        "cycle": 0,
        "rule": "",
        "objective": None,
        "val_objective": None,
        "test_objective": None,
        "commit": None,
        "prompts": dict(seeds.get(policy, {})),
        "policy_config": {"type": policy},
        "agent": {"model": "m", "base_url": base_url},
    }
    return Exported(**{**values, **fields})
