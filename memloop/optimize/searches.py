"""The `Search` contract and its registry.

A search turns a run context into cycles: it decides which prompts each cycle evaluates on which
users and how the next prompts come about, and yields one `CycleRecord` per cycle, resuming from
the context's `CycleStore` (a finished cycle is read back, not redone). It never logs and never
selects: `RunContext.run(search.cycles(ctx))` logs what it yields and `cycles.select_cycle`
makes the one choice.

Built in (by name in the experiment YAML's `search:` key):
- `episode`: a cycle evaluates the current prompts on whole episodes of every split, makes one
  feedback summary from the training users, and the evolver proposes the next prompts;
- `period`: the paper's Algorithm 1, prompts evolve after every period inside the training users'
  episodes (memory kept); each period's prompt is also evaluated on whole val/test episodes;
- `gepa`: gepa's reflective Pareto search (it evolves the prompts itself; needs val users).

Register your own with `register_search("name", obj)`, or name it in the YAML as
`package.module:attribute`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from memloop.core.errors import UserError

if TYPE_CHECKING:
    from memloop.optimize.config import EvolveConfig
    from memloop.optimize.context import RunContext
    from memloop.optimize.cycles import CycleRecord


@runtime_checkable
class Search(Protocol):
    name: str
    needs_val: bool  # refuses to start without validation users
    evolves_itself: bool  # True: ignores the config's evolvers (conditions are (mode, name))

    def spec(self, config: EvolveConfig) -> dict[str, Any]:
        """The settings that define this search's results (part of the run key)."""
        ...

    def cycles(self, ctx: RunContext) -> Iterator[CycleRecord]:
        """Yield cycle 0, 1, ... in order, each saved in `ctx.store` before it is yielded."""
        ...


_BUILTIN = {
    "episode": "memloop.optimize.episode_search:EpisodeSearch",
    "period": "memloop.optimize.period_cadence:PeriodSearch",
    "gepa": "memloop.optimize.gepa_search:GepaSearch",
}
_REGISTERED: dict[str, Search] = {}


def register_search(name: str, search: Search) -> None:
    """Make `search` available as `search: <name>` in experiment YAML files."""
    if not isinstance(search, Search):
        raise TypeError(f"{search!r} does not implement the Search protocol")
    _REGISTERED[name] = search


def search_names() -> list[str]:
    return sorted(set(_BUILTIN) | set(_REGISTERED))


def get_search(name: str) -> Search:
    """The search called `name`: registered, built in, or `package.module:attribute`."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    target = _BUILTIN.get(name, name)
    if ":" not in target:
        raise UserError(f"key 'search': unknown search {name!r}; use one of {search_names()}")
    module_name, _, attr = target.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"key 'search': cannot load {target!r} ({exc})") from None
    search = found() if isinstance(found, type) else found
    if not isinstance(search, Search):
        raise UserError(
            f"key 'search': {target!r} is not a search (needs name, needs_val, "
            "evolves_itself, spec and cycles)"
        )
    return search
