"""What every evolver shares, and the order its methods are called in.

An evolver is a class with `name`, a pydantic `Settings` model and `propose` (the `Evolver`
Protocol in optimize/contract.py). The run calls it in this order, and each step may assume
what the steps before it did:

1. `registry.build_evolver(name, client, raw, base_dir)` validates the YAML's
   `settings.<name>` into `Settings` and builds `Cls(client, settings)` once per condition;
   `client` is the optimizer role's model (it may be unused, as in `none`).
2. A search (optimize/searches/) finishes a cycle: its prompts were evaluated, its
   `CycleRecord` and `FeedbackSummary` are saved in the run's store.
3. The search calls `contract.propose(evolver, EvolveInput(...))`, never `propose` directly.
   The input holds the current prompts, the summary (private values included, for the leak
   check only), the cycle, the history of validation scores, an optional replay `screen` and
   the edits earlier steps refused. `contract.propose` wraps the screen so that no leaking
   candidate is replayed.
4. `Cls.propose(inputs)` returns an `EvolveStep`: it may call `client`, `inputs.screen` and
   `inputs.leaks`, and must not write files or log (the search saves the step, the context logs
   it).
5. `contract.propose` checks the step: unknown predictors are dropped, empty or leaking texts
   keep the old prompt (recorded in `errors`, leaks counted in `leaks_rejected`).
6. The search saves the step (`CycleStore.save_step`) and adds its tokens, cost and leak count
   to the cycle's record (`CycleRecord.add_step`); the next cycle evaluates `step.prompts`.

`optimize/evolver_check.py` (`check_evolver`) runs an evolver through these steps on a
scripted summary. The built-in evolvers: `none` (none.py), `reflective` (reflective.py),
`playbook` (playbook.py), `edits` (edits.py, with worked examples from examples.py).
"""

from __future__ import annotations

SENTENCE_ENDINGS = (".", "!", "?", ")", '"', "'")


def strip_wrapper(text: str) -> str:
    """The reply without the <instructions> tags small models copy from the request."""
    text = text.strip()
    for tag in ("instructions", "new_instructions"):
        if text.startswith(f"<{tag}>"):
            text = text[len(tag) + 2 :]
        if text.endswith(f"</{tag}>"):
            text = text[: -len(tag) - 3]
    return text.strip()
