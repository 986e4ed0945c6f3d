"""What every search may assume, and the order a run calls a search in.

A search is a class with `name`, a pydantic `Settings` model, `needs_val`, `evolves_itself` and
`cycles(ctx)` (the `Search` Protocol in optimize/contract.py). The run calls it in this order:

1. `registry.build_search(name, raw, base_dir)` validates `settings.<name>` and builds
   `Cls(settings)`. `evolve.conditions` pairs it with each feedback mode and evolver (a search
   that evolves by itself, `evolves_itself`, is paired with modes only); `run_evolve` refuses a
   search that `needs_val` on an environment without validation users, before anything starts.
2. `RunContext` (optimize/context.py) opens the run: its folder (locked; resumed or refused),
   its `RunSpec`, the users of each split, the role clients and the `CycleStore`.
3. `ctx.run(search.cycles(ctx))` pulls cycles one at a time. For cycle k the search:
   - takes the cycle's prompts with `ctx.store.prompts(k, previous)` (fixed the first time the
     cycle starts, so a resumed run evaluates the same prompts);
   - reads back a finished cycle with `ctx.store.record(k)`, or evaluates the prompts
     (`ctx.evaluate_splits`) and builds the record with `CycleRecord.of(...)`;
   - asks for the next prompts through `contract.propose(evolver, EvolveInput(...))`
     (optimize/evolvers/base.py gives the evolver's side), saves the step with
     `ctx.store.save_step` and adds it to the record with `record.add_step(step)`;
   - saves the record (`ctx.store.save`) and then yields it.
4. For every yielded record the context checks that no prompt names a private value
   (`check_no_leak`) and logs the cycle to MLflow (`log_cycle`). A search never logs.
5. After the last cycle the context selects on validation users (`runs.cycles.select_cycle`)
   and logs the selection. A search's own choices (GEPA's Pareto front, its best candidate on
   validation users) only decide which prompts it evaluates next; the run's selection is the
   context's alone.

A search must yield cycle 0, 1, ... in order, each saved before it is yielded, and redo nothing
the store already holds. Every built-in search yields each cycle as it finishes (GEPA: as its
iteration finishes, gepa being called once per cycle), and each cycle's record counts the work
done for it, so the cycles' sums are the run's. `optimize/search_check.py` (`check_search`)
checks this on a fake model. The built-in searches: `episode` (episode.py), `period`
(period.py), `gepa` (gepa.py).
"""
